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
  // Every buffer first: if one allocation runs out of memory, no parameter has been touched yet.
  for (const auto& bucket : layout_) {
    buffers_.push_back(
        at::zeros({bucket.numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device)));
  }
  // Where the all-reduce runs in another dtype: one persistent copy per bucket (with one rank
  // nothing is reduced, so nothing is cast).
  wire_.resize(layout_.size());
  const auto wire_dtype = options_.reduce_dtype;
  for (size_t b = 0; b < layout_.size(); ++b) {
    if (wire_dtype == c10::ScalarType::Undefined || wire_dtype == layout_[b].dtype ||
        comm_.size() == 1 || !at::isFloatingType(layout_[b].dtype)) {
      continue;
    }
    wire_[b] = at::zeros({layout_[b].numel},
                         at::TensorOptions().dtype(wire_dtype).device(layout_[b].device));
  }
  bucket_of_.resize(params_.size());
  for (size_t b = 0; b < layout_.size(); ++b) {
    const auto& bucket = layout_[b];
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t k = bucket.params[j];
      at::Tensor& p = params_[k].second;
      bucket_of_[k] = b;
      // The gradient takes the parameter's layout (dense: a channels-last weight's gradient is
      // channels-last too), so the optimizer walks parameter and gradient in the same order.
      at::Tensor flat = buffers_[b].narrow(0, bucket.offsets[j], p.numel());
      p.mutable_grad() = p.is_contiguous() ? flat.view(p.sizes())
                                           : flat.as_strided(p.sizes(), p.strides());
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>(this, k));
    }
  }
  pending_.assign(layout_.size(), 0);
  ready_.assign(params_.size(), 0);
  works_.resize(layout_.size());
}

int64_t Reducer::communication_bytes() const {
  int64_t bytes = 0;
  for (const auto& w : wire_) {
    if (w.defined()) bytes += w.nbytes();
  }
  return bytes;
}

Reducer::~Reducer() noexcept {
  for (auto& [name, p] : params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void Reducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& buffer : buffers_) buffer.zero_();
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

void Reducer::post_ready_buckets() {
  while (next_bucket_ < layout_.size() && pending_[next_bucket_] == 0) {
    // One rank: the sum over ranks is the bucket itself; nothing is posted or waited for.
    if (comm_.size() > 1) {
      at::Tensor& wire = wire_[next_bucket_];
      if (wire.defined()) wire.copy_(buffers_[next_bucket_]);  // cast (on the caller's stream)
      works_[next_bucket_] = comm_.all_reduce_async(wire.defined() ? wire : buffers_[next_bucket_],
                                                    ReduceOp::kSum,
                                                    fmt::format("bucket {}", next_bucket_));
    }
    launch_order_.push_back(next_bucket_);
    if (in_backward_) ++launched_during_backward_;
    ++next_bucket_;
  }
}

void Reducer::drive_progress() {
  // MPI progresses non-blocking collectives only inside MPI calls: poke the posted ones.
  for (size_t b = 0; b < next_bucket_; ++b) {
    if (works_[b]) works_[b]->is_completed();
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
    if (!works_[b]) continue;
    works_[b]->wait();
    if (wire_[b].defined()) buffers_[b].copy_(wire_[b]);  // cast back into the float32 bucket
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
