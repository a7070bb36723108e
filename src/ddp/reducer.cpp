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
  for (size_t i = 0; i < params.size(); ++i) mine[i] = fnv1a(signature(params[i].first, params[i].second));
  at::Tensor all = at::empty({comm.size() * n}, at::kLong);
  comm.all_gather(all, mine, "parameter signatures");
  all = all.view({comm.size(), n});
  const at::Tensor differs = (all != all[0]).any(0);
  if (!differs.any().item<bool>()) return;
  const int64_t i = differs.nonzero()[0][0].item<int64_t>();
  const auto names = all_gather_strings(
      comm, i < static_cast<int64_t>(params.size()) ? signature(params[i].first, params[i].second)
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
  std::vector<ParamMeta> meta;
  for (const auto& [name, p] : params_) meta.push_back({p.numel(), p.scalar_type(), p.device()});
  layout_ = assign_buckets(meta, options_.first_bucket_bytes, options_.bucket_bytes);
  for (const auto& bucket : layout_) {
    if (sharded()) shards_.push_back(shard_bucket(bucket.numel, comm_.size(), comm_.rank()));
  }
  // Every buffer first: if one allocation runs out of memory, no parameter has been touched yet.
  // Sharded buckets are padded to a multiple of the world size; ZeRO-2 allocates them per step.
  for (size_t b = 0; b < layout_.size(); ++b) {
    const auto& bucket = layout_[b];
    const int64_t numel = sharded() ? shards_[b].padded : bucket.numel;
    buffers_.push_back(zero2() ? at::Tensor()
                               : at::zeros({numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device)));
  }
  // Where the all-reduce runs in another dtype: one persistent copy per bucket (with one rank
  // nothing is reduced, so nothing is cast).
  wire_.resize(layout_.size());
  for (size_t b = 0; b < layout_.size(); ++b) {
    if (!has_wire(b) || zero2()) continue;
    wire_[b] = at::zeros({buffers_[b].numel()},
                         at::TensorOptions().dtype(options_.reduce_dtype).device(layout_[b].device));
  }
  if (sharded()) setup_shards();  // allocates the rest, then makes the parameters flat views
  bucket_of_.resize(params_.size());
  if (zero2()) pre_hooks_.resize(params_.size());
  for (size_t b = 0; b < layout_.size(); ++b) {
    const auto& bucket = layout_[b];
    if (buffers_[b].defined()) point_gradients(b);
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t k = bucket.params[j];
      at::Tensor& p = params_[k].second;
      bucket_of_[k] = b;
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>(this, k));
      if (zero2()) {
        pre_hooks_[k] = p.register_hook([this, k](const at::Tensor&) { on_gradient_arriving(k); });
      }
    }
  }
  pending_.assign(layout_.size(), 0);
  ready_.assign(params_.size(), 0);
  works_.resize(layout_.size());
  completed_.assign(layout_.size(), 0);
}

bool Reducer::has_wire(size_t b) const {
  const auto wire_dtype = options_.reduce_dtype;
  return wire_dtype != c10::ScalarType::Undefined && wire_dtype != layout_[b].dtype &&
         comm_.size() > 1 && at::isFloatingType(layout_[b].dtype);
}

void Reducer::point_gradients(size_t b) {
  // The gradient takes the parameter's layout (dense: a channels-last weight's gradient is
  // channels-last too), so the optimizer walks parameter and gradient in the same order.
  for (size_t j = 0; j < layout_[b].params.size(); ++j) {
    at::Tensor& p = params_[layout_[b].params[j]].second;
    p.mutable_grad() = param_view(buffers_[b], b, j);
  }
}

at::Tensor Reducer::param_view(const at::Tensor& flat, size_t b, size_t j) const {
  const at::Tensor& p = params_[layout_[b].params[j]].second;
  at::Tensor piece = flat.narrow(0, layout_[b].offsets[j], p.numel());
  return p.is_contiguous() ? piece.view(p.sizes()) : piece.as_strided(p.sizes(), p.strides());
}

int64_t Reducer::communication_bytes() const {
  int64_t bytes = 0;
  for (const auto& w : wire_) {
    if (w.defined()) bytes += w.nbytes();
  }
  return bytes;
}

Reducer::~Reducer() noexcept {
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& p = params_[k].second;
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    if (zero2()) p.remove_hook(pre_hooks_[k]);
  }
}

void Reducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (zero2()) {
    for (size_t b = 0; b < layout_.size(); ++b) release_bucket(b);
  } else {
    for (auto& buffer : buffers_) buffer.zero_();
  }
  state_ = StepState::kIdle;
}

void Reducer::begin_micro_batch(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == StepState::kSyncing || state_ == StepState::kDone) {
    throw std::logic_error("Reducer: a micro-batch after the synced one; call zero_grad() first");
  }
  if (sync) {
    start_sync();
  } else {
    state_ = StepState::kAccumulating;
  }
}

void Reducer::start_sync() {
  for (size_t b = 0; b < layout_.size(); ++b) {
    pending_[b] = static_cast<int64_t>(layout_[b].params.size());
    works_[b].reset();
    completed_[b] = 0;
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
  if (state_ != StepState::kSyncing) return;  // no_sync micro-batch: accumulate only
  if (ready_[param]) {
    throw ParameterError(fmt::format(
        "parameter '{}' received a gradient twice in one synced backward; call "
        "begin_micro_batch(true) before each backward", params_[param].first));
  }
  ready_[param] = 1;
  --pending_[bucket_of_[param]];
  post_ready_buckets();
  drive_progress();
}

void Reducer::on_gradient_arriving(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  acquire_bucket(bucket_of_[param]);
}

void Reducer::post_ready_buckets() {
  while (next_bucket_ < layout_.size() && pending_[next_bucket_] == 0) {
    post_bucket(next_bucket_);
    launch_order_.push_back(next_bucket_);
    if (in_backward_) ++launched_during_backward_;
    ++next_bucket_;
  }
}

void Reducer::post_bucket(size_t b) {
  const std::string what = fmt::format("bucket {}", b);
  if (sharded()) {
    acquire_bucket(b);  // ZeRO-2: a bucket no gradient reached, or abandon()
    if (comm_.size() == 1) {  // the one block is the whole bucket, reduced over one rank
      if (!shard_grads_[b].is_same(buffers_[b])) shard_grads_[b].copy_(buffers_[b]);
      complete_bucket(b);
      return;
    }
    if (wire_[b].defined()) {
      wire_[b].copy_(buffers_[b]);  // cast (on the caller's stream)
      works_[b] = comm_.reduce_scatter_async(wire_shards_[b], wire_[b], ReduceOp::kSum, what);
    } else {
      works_[b] = comm_.reduce_scatter_async(shard_grads_[b], buffers_[b], ReduceOp::kSum, what);
    }
    return;
  }
  // One rank: the sum over ranks is the bucket itself; nothing is posted or waited for.
  if (comm_.size() > 1) {
    at::Tensor& wire = wire_[b];
    if (wire.defined()) wire.copy_(buffers_[b]);  // cast (on the caller's stream)
    works_[b] = comm_.all_reduce_async(wire.defined() ? wire : buffers_[b], ReduceOp::kSum, what);
  }
}

void Reducer::complete_bucket(size_t b) {
  completed_[b] = 1;
  if (!sharded()) {
    if (wire_[b].defined()) buffers_[b].copy_(wire_[b]);  // cast back into the float32 bucket
    return;
  }
  if (wire_shards_[b].defined()) shard_grads_[b].copy_(wire_shards_[b]);
  if (zero2()) release_bucket(b);  // its full buffer was needed only in flight
}

void Reducer::drive_progress() {
  // MPI progresses non-blocking collectives only inside MPI calls: poke the posted ones. ZeRO-2
  // frees a bucket as soon as its reduce-scatter is done, while backward still runs.
  for (size_t b = 0; b < next_bucket_; ++b) {
    if (works_[b] && !completed_[b] && works_[b]->is_completed() && zero2()) complete_bucket(b);
  }
}

void Reducer::mark_all_ready() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) {
      ready_[k] = 1;
      --pending_[bucket_of_[k]];
    }
  }
}

void Reducer::wait_all() {
  for (size_t b = 0; b < layout_.size(); ++b) {
    if (!works_[b] || completed_[b]) continue;
    works_[b]->wait();
    complete_bucket(b);
  }
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
