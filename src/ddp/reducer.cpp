#include "ddp/reducer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/gather.h"

namespace ddp {
namespace {

class ReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(Reducer* reducer, size_t param) : reducer_(reducer), param_(param) {}
  void operator()(const torch::autograd::Variable& /*param*/) override {
    reducer_->on_gradient_ready(param_);
  }

 private:
  Reducer* reducer_;
  size_t param_;
};

std::string signature(const std::string& name, const at::Tensor& p) {
  return fmt::format("'{}' {} {}", name, p.sizes(), c10::toString(p.scalar_type()));
}

int64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return static_cast<int64_t>(h >> 1);  // non-negative, so 0 can mean "no parameter"
}

}  // namespace

void verify_same_parameters(Communicator& comm, const NamedParameters& params) {
  // Pad to the longest list, so ranks with a different count still compare position by position.
  at::Tensor count = at::tensor({static_cast<int64_t>(params.size())}, at::kLong);
  comm.all_reduce(count, ReduceOp::kMax, "parameter count");
  const int64_t n = count.item<int64_t>();
  at::Tensor mine = at::zeros({n}, at::kLong);
  for (size_t i = 0; i < params.size(); ++i) {
    mine[i] = fnv1a(signature(params[i].first, params[i].second));
  }
  at::Tensor all = at::empty({comm.size() * n}, at::kLong);
  comm.all_gather(all, mine, "parameter signatures");
  all = all.view({comm.size(), n});
  const at::Tensor differs = (all != all[0]).any(0);
  if (!differs.any().item<bool>()) return;
  const int64_t i = differs.nonzero()[0][0].item<int64_t>();
  const auto names = all_gather_strings(comm, i < static_cast<int64_t>(params.size())
                                                  ? signature(params[i].first, params[i].second)
                                                  : std::string("(no such parameter)"));
  std::string detail;
  for (int r = 0; r < comm.size(); ++r) detail += fmt::format("\n  rank {}: {}", r, names[r]);
  throw ParameterError(fmt::format(
      "ranks hold different parameters: parameter #{} differs (of {} on this rank):{}\nEvery rank "
      "must build the same model from the same configuration.",
      i, params.size(), detail));
}

Reducer::Reducer(NamedParameters params, Communicator& comm, ReducerOptions options,
                 Communicator* control)
    : params_(std::move(params)), comm_(comm), options_(options) {
  verify_same_parameters(control != nullptr ? *control : comm_, params_);
  if (shards_parameters() &&
      !options_.frozen.empty()) {  // every rank has frozen tensors, or none does
    NamedParameters frozen;
    for (const auto& unit : options_.frozen) frozen.insert(frozen.end(), unit.begin(), unit.end());
    verify_same_parameters(control != nullptr ? *control : comm_, frozen);
  }
  std::vector<ParamMeta> meta;
  for (const auto& [name, p] : params_) meta.push_back({p.numel(), p.scalar_type(), p.device()});
  layout_ = shards_parameters()
                ? unit_layout()
                : assign_buckets(meta, options_.first_bucket_bytes, options_.bucket_bytes);
  buckets_.reserve(layout_.size());  // never grows again: each Bucket refers to its layout
  for (const auto& layout : layout_) {
    Bucket& bucket = buckets_.emplace_back(layout);
    if (sharded()) bucket.shard = shard_bucket(layout.numel, comm_.size(), comm_.rank());
  }
  // Every buffer first: if one allocation runs out of memory, no parameter has been touched yet.
  // Sharded buckets are padded to a multiple of the world size; ZeRO-2 allocates them per step.
  if (!shards_gradients()) {
    for (Bucket& bucket : buckets_) {
      const int64_t numel = sharded() ? bucket.shard.padded : bucket.layout.numel;
      const bool rides = options_.rider_slots > 0 && !sharded() && &bucket == &buckets_.front();
      bucket.carried =
          at::zeros({numel + (rides ? options_.rider_slots : 0)},
                    at::TensorOptions().dtype(bucket.layout.dtype).device(bucket.layout.device));
      bucket.gradients = bucket.carried.narrow(0, 0, numel);
      if (rides) rider_ = bucket.carried.narrow(0, numel, options_.rider_slots);
    }
    // Where the all-reduce runs in another dtype: one persistent copy per bucket (with one rank
    // nothing is reduced, so nothing is cast).
    for (Bucket& bucket : buckets_) {
      if (!has_wire(bucket)) continue;
      bucket.wire =
          at::zeros({bucket.carried.numel()},
                    at::TensorOptions().dtype(options_.reduce_dtype).device(bucket.layout.device));
    }
  }
  if (rider_.defined() && !at::isFloatingType(rider_.scalar_type())) {
    throw std::invalid_argument("Reducer: the rider needs a floating-point first bucket");
  }
  if (sharded()) setup_shards();  // allocates the rest, then makes the parameters flat views
  bucket_of_.resize(params_.size());
  if (shards_gradients()) pre_hooks_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].gradients.defined()) point_gradients(buckets_[b]);
    for (const size_t k : layout_[b].params) {
      at::Tensor& p = params_[k].second;
      bucket_of_[k] = b;
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>(this, k));
      if (shards_gradients()) {
        pre_hooks_[k] = p.register_hook([this, k](const at::Tensor&) { on_gradient_arriving(k); });
      }
    }
  }
  ready_.assign(params_.size(), 0);
}

bool Reducer::has_wire(const Bucket& bucket) const {
  const auto wire_dtype = options_.reduce_dtype;
  return wire_dtype != c10::ScalarType::Undefined && wire_dtype != bucket.layout.dtype &&
         comm_.size() > 1 && at::isFloatingType(bucket.layout.dtype);
}

void Reducer::point_gradients(const Bucket& bucket) {
  // The gradient takes the parameter's layout (dense: a channels-last weight's gradient is
  // channels-last too), so the optimizer walks parameter and gradient in the same order.
  for (size_t j = 0; j < bucket.layout.params.size(); ++j) {
    at::Tensor& p = params_[bucket.layout.params[j]].second;
    p.mutable_grad() = param_view(bucket.gradients, bucket.layout, j);
  }
}

at::Tensor Reducer::param_view(const at::Tensor& flat, const BucketLayout& layout, size_t j) const {
  const at::Tensor& p = params_[layout.params[j]].second;
  at::Tensor piece = flat.narrow(0, layout.offsets[j], p.numel());
  return p.is_contiguous() ? piece.view(p.sizes()) : piece.as_strided(p.sizes(), p.strides());
}

std::vector<at::Tensor> Reducer::buffers() const {
  std::vector<at::Tensor> out;
  for (const Bucket& bucket : buckets_) out.push_back(bucket.gradients);
  return out;
}

int64_t Reducer::communication_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_) {
    if (bucket.wire.defined()) bytes += bucket.wire.nbytes();
  }
  return bytes;
}

Reducer::~Reducer() noexcept {
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& p = params_[k].second;
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    if (shards_gradients()) p.remove_hook(pre_hooks_[k]);
  }
}

void Reducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Bucket& bucket : buckets_) {
    if (shards_gradients()) {
      release_bucket(bucket);
    } else {
      bucket.gradients.zero_();
    }
  }
  state_ = StepState::kIdle;
}

void Reducer::begin_micro_batch(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == StepState::kSyncing || state_ == StepState::kDone) {
    throw std::logic_error("Reducer: a micro-batch after the synced one; call zero_grad() first");
  }
  for (Bucket& bucket : buckets_) {
    bucket.unit_pending = static_cast<int64_t>(bucket.layout.params.size());
    bucket.landed = false;
  }
  if (sync) {
    start_sync();
  } else {
    state_ = StepState::kAccumulating;
  }
}

void Reducer::start_sync() {
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.layout.params.size());
    bucket.work.reset();
    bucket.completed = false;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  launch_order_.clear();
  next_bucket_ = 0;
  launched_during_backward_ = 0;
  in_backward_ = true;
  state_ = StepState::kSyncing;
}

void Reducer::on_gradient_ready(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shards_parameters()) on_unit_gradient(param);
  if (state_ != StepState::kSyncing) return;  // no_sync micro-batch: accumulate only
  if (ready_[param]) {
    throw ParameterError(
        fmt::format("parameter '{}' received a gradient twice in one synced backward; call "
                    "begin_micro_batch(true) before each backward",
                    params_[param].first));
  }
  ready_[param] = 1;
  --buckets_[bucket_of_[param]].pending;
  post_ready_buckets();
  drive_progress();
}

void Reducer::on_gradient_arriving(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  acquire_bucket(buckets_[bucket_of_[param]]);
}

// Note [One reduce-scatter in flight]
// Under ddp.shard: parameters each unit's full gradient lives from its backward until its
// reduce-scatter is done; drive_progress() frees it only when a later gradient finds that done,
// so ranks that run ahead of a slower one (oversubscribed CPU ranks, uneven GPUs) would hold
// every unit's full gradient by the end of backward: the whole model's, which the plan does not
// count (it counts one unit's). So before posting a unit's reduce-scatter, the previous ones are
// waited for and freed: at most one in flight while the next unit's backward computes (FSDP's
// overlap of one). Every rank posts the same buckets in the same order, so the wait meets them.
void Reducer::wait_in_flight() {
  for (size_t b = 0; b < next_bucket_; ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.work || bucket.completed) continue;
    bucket.work->wait();
    complete_bucket(bucket);
  }
}

void Reducer::post_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    if (shards_parameters()) wait_in_flight();  // Note [One reduce-scatter in flight]
    post_bucket(next_bucket_);
    launch_order_.push_back(next_bucket_);
    if (in_backward_) ++launched_during_backward_;
    ++next_bucket_;
  }
}

void Reducer::post_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  const std::string what = fmt::format("bucket {}", b);
  if (sharded()) {
    acquire_bucket(bucket);   // ZeRO-2: a bucket no gradient reached, or abandon()
    if (comm_.size() == 1) {  // the one block is the whole bucket, reduced over one rank
      if (!bucket.reduced.is_same(bucket.gradients)) bucket.reduced.copy_(bucket.gradients);
      complete_bucket(bucket);
      return;
    }
    if (bucket.wire.defined()) {
      bucket.wire.copy_(bucket.gradients);  // cast (on the caller's stream)
      bucket.work =
          comm_.reduce_scatter_async(bucket.wire_reduced, bucket.wire, ReduceOp::kSum, what);
    } else {
      bucket.work =
          comm_.reduce_scatter_async(bucket.reduced, bucket.gradients, ReduceOp::kSum, what);
    }
    return;
  }
  // One rank: the sum over ranks is the bucket itself; nothing is posted or waited for.
  if (comm_.size() > 1) {
    if (bucket.wire.defined()) bucket.wire.copy_(bucket.carried);  // cast (caller's stream)
    bucket.work = comm_.all_reduce_async(bucket.wire.defined() ? bucket.wire : bucket.carried,
                                         ReduceOp::kSum, what);
  }
}

void Reducer::complete_bucket(Bucket& bucket) {
  bucket.completed = true;
  if (!sharded()) {
    // Cast back into the float32 bucket.
    if (bucket.wire.defined()) bucket.carried.copy_(bucket.wire);
    return;
  }
  if (bucket.wire_reduced.defined()) bucket.reduced.copy_(bucket.wire_reduced);
  if (shards_gradients()) release_bucket(bucket);  // its full buffer was needed only in flight
}

void Reducer::drive_progress() {
  // MPI progresses non-blocking collectives only inside MPI calls: poke the posted ones. ZeRO-2
  // frees a bucket as soon as its reduce-scatter is done, while backward still runs.
  for (size_t b = 0; b < next_bucket_; ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.work && !bucket.completed && bucket.work->is_completed() && shards_gradients()) {
      complete_bucket(bucket);
    }
  }
}

void Reducer::mark_all_ready() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) {
      ready_[k] = 1;
      --buckets_[bucket_of_[k]].pending;
    }
  }
}

void Reducer::wait_all() {
  for (Bucket& bucket : buckets_) {
    if (!bucket.work || bucket.completed) continue;
    bucket.work->wait();
    complete_bucket(bucket);
  }
  reduce_replicas();
  state_ = StepState::kDone;
}

void Reducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != StepState::kSyncing) {
    throw std::logic_error("Reducer::finish() without begin_micro_batch(true)");
  }
  in_backward_ = false;
  std::vector<std::string> unused;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) unused.push_back(params_[k].first);
  }
  if (!unused.empty() && !options_.find_unused_parameters) {
    throw ParameterError(fmt::format(
        "rank {}: {} parameter(s) received no gradient at step {}: {}. If the model leaves them "
        "unused on purpose, set ddp.find_unused_parameters: true.",
        comm_.rank(), unused.size(), comm_.step(), fmt::join(unused, ", ")));
  }
  mark_all_ready();
  post_ready_buckets();
  wait_all();
}

void Reducer::reduce_accumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != StepState::kAccumulating) {
    throw std::logic_error("Reducer::reduce_accumulated() without accumulating micro-batches");
  }
  start_sync();
  in_backward_ = false;
  mark_all_ready();
  post_ready_buckets();
  wait_all();
}

void Reducer::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == StepState::kDone) return;  // every bucket was posted and completed
  if (state_ != StepState::kSyncing) start_sync();
  in_backward_ = false;
  mark_all_ready();
  post_ready_buckets();
  wait_all();
}

}  // namespace ddp
