// The sharded part of the Reducer (ddp.shard: optimizer | gradients; see ddp/reducer.h): the
// per-bucket blocks, the flat parameters, ZeRO-2's per-step buckets, and the conversions between
// per-bucket blocks and full per-parameter tensors (checkpoints).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "ddp/reducer.h"

namespace ddp {

void Reducer::setup_shards() {
  const auto options = [&](size_t b, at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(layout_[b].device);
  };
  // Every allocation before any parameter moves (the OOM rule of the constructor).
  for (size_t b = 0; b < layout_.size(); ++b) {
    param_buffers_.push_back(at::zeros({shards_[b].padded}, options(b, layout_[b].dtype)));
    // One rank, ZeRO-1: the block is the whole bucket; nothing to copy.
    shard_grads_.push_back(comm_.size() == 1 && !zero2()
                               ? buffers_[b]
                               : at::zeros({shards_[b].size}, options(b, layout_[b].dtype)));
    wire_shards_.push_back(has_wire(b) ? at::zeros({shards_[b].size}, options(b, options_.reduce_dtype))
                                       : at::Tensor());
  }
  // The parameters become views into the flat buffers: the same Variables (the model, the
  // optimizer and autograd keep them), new storage.
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_.size(); ++b) {
    for (size_t j = 0; j < layout_[b].params.size(); ++j) {
      at::Tensor& p = params_[layout_[b].params[j]].second;
      at::Tensor view = param_view(param_buffers_[b], b, j);
      view.copy_(p.detach());
      p.set_data(view);
    }
  }
}

void Reducer::acquire_bucket(size_t b) {
  if (buffers_[b].defined()) return;
  const auto& bucket = layout_[b];
  buffers_[b] = at::zeros({shards_[b].padded},
                          at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
  if (has_wire(b)) {
    wire_[b] = at::empty({shards_[b].padded},
                         at::TensorOptions().dtype(options_.reduce_dtype).device(bucket.device));
  }
  point_gradients(b);
}

void Reducer::release_bucket(size_t b) {
  if (!buffers_[b].defined()) return;
  for (size_t k : layout_[b].params) params_[k].second.mutable_grad() = at::Tensor();
  works_[b].reset();  // an MPI work keeps its input alive
  buffers_[b] = at::Tensor();
  wire_[b] = at::Tensor();
}

int64_t Reducer::gradient_bytes() const {
  int64_t bytes = communication_bytes();
  for (const auto& t : buffers_) {
    if (t.defined()) bytes += t.nbytes();
  }
  for (size_t b = 0; b < shard_grads_.size(); ++b) {
    if (!shard_grads_[b].is_same(buffers_[b])) bytes += shard_grads_[b].nbytes();
    if (wire_shards_[b].defined()) bytes += wire_shards_[b].nbytes();
  }
  return bytes;
}

const std::vector<at::Tensor>& Reducer::reduced_gradients() const {
  return sharded() ? shard_grads_ : buffers_;
}

std::vector<at::Tensor> Reducer::parameter_shards() const {
  std::vector<at::Tensor> out;
  for (size_t b = 0; b < param_buffers_.size(); ++b) {
    out.push_back(param_buffers_[b].narrow(0, shards_[b].begin, shards_[b].size));
  }
  return out;
}

void Reducer::gather_parameters() {
  if (!sharded() || comm_.size() == 1) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Every bucket in flight at once, in bucket order on every rank.
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < param_buffers_.size(); ++b) {
    works.push_back(comm_.all_gather_async(
        param_buffers_[b], param_buffers_[b].narrow(0, shards_[b].begin, shards_[b].size),
        fmt::format("parameters of bucket {}", b)));
  }
  for (auto& w : works) w->wait();
}

std::vector<at::Tensor> Reducer::unshard(const std::vector<at::Tensor>& blocks, int root) {
  if (!sharded() || blocks.size() != layout_.size()) {
    throw std::logic_error("Reducer::unshard: sharded buckets and one block per bucket");
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  if (comm_.rank() == root) out.resize(params_.size());
  for (size_t b = 0; b < layout_.size(); ++b) {
    at::Tensor full = at::empty({shards_[b].padded}, blocks[b].options());
    if (comm_.size() > 1) {
      comm_.all_gather(full, blocks[b], fmt::format("optimizer state of bucket {}", b));
    } else {
      full.copy_(blocks[b]);
    }
    if (comm_.rank() != root) continue;
    for (size_t j = 0; j < layout_[b].params.size(); ++j) {
      out[layout_[b].params[j]] = param_view(full, b, j).to(at::kCPU, /*non_blocking=*/false,
                                                              /*copy=*/true);
    }
  }
  return out;
}

void Reducer::shard_from(const std::vector<at::Tensor>* full,
                         const std::vector<at::Tensor>& blocks) {
  if (!sharded() || blocks.size() != layout_.size() ||
      (full != nullptr && full->size() != params_.size())) {
    throw std::logic_error("Reducer::shard_from: sharded buckets, one block per bucket and one "
                           "tensor per parameter");
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_.size(); ++b) {
    at::Tensor flat = flat_bucket(full, b, blocks[b].options());
    if (comm_.size() > 1) comm_.broadcast(flat, 0, fmt::format("optimizer state of bucket {}", b));
    blocks[b].copy_(flat.narrow(0, shards_[b].begin, shards_[b].size));
  }
}

std::vector<at::Tensor> Reducer::blocks_of(const std::vector<at::Tensor>& full) const {
  if (sharded() || full.size() != params_.size()) {
    throw std::logic_error("Reducer::blocks_of: unsharded buckets and one tensor per parameter");
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> blocks;
  for (size_t b = 0; b < layout_.size(); ++b) {
    const BucketShard shard = shard_bucket(layout_[b].numel, comm_.size(), comm_.rank());
    // One bucket's flat copy at a time: the extra memory is one bucket.
    blocks.push_back(flat_bucket(&full, b, full[layout_[b].params[0]].options())
                         .narrow(0, shard.begin, shard.size)
                         .clone());
  }
  return blocks;
}

at::Tensor Reducer::flat_bucket(const std::vector<at::Tensor>* full, size_t b,
                                const at::TensorOptions& options) const {
  const int64_t padded = shard_bucket(layout_[b].numel, comm_.size(), comm_.rank()).padded;
  at::Tensor flat = at::zeros({padded}, options);
  if (full != nullptr) {
    for (size_t j = 0; j < layout_[b].params.size(); ++j) {
      param_view(flat, b, j).copy_((*full)[layout_[b].params[j]]);
    }
  }
  return flat;
}

void Reducer::shard_in_place(ShardMode mode) {
  if (sharded() || mode != ShardMode::kOptimizer) {
    throw std::logic_error("Reducer::shard_in_place: from unsharded to ddp.shard: optimizer only");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == StepState::kSyncing || state_ == StepState::kAccumulating) {
    throw std::logic_error("Reducer::shard_in_place: a step is in progress");
  }
  options_.shard = mode;
  for (const auto& bucket : layout_) {
    shards_.push_back(shard_bucket(bucket.numel, comm_.size(), comm_.rank()));
  }
  // Sharded buckets are padded to a multiple of the world size: an unpadded one is replaced (its
  // contents belong to the abandoned step), the old freed before the new is allocated.
  for (size_t b = 0; b < layout_.size(); ++b) {
    works_[b].reset();  // an MPI work keeps its buffers alive
    if (buffers_[b].numel() == shards_[b].padded) continue;
    for (size_t k : layout_[b].params) params_[k].second.mutable_grad() = at::Tensor();
    const auto options = buffers_[b].options();
    buffers_[b] = at::Tensor();
    buffers_[b] = at::zeros({shards_[b].padded}, options);
    if (wire_[b].defined()) {
      const auto wire_options = wire_[b].options();
      wire_[b] = at::Tensor();
      wire_[b] = at::zeros({shards_[b].padded}, wire_options);
    }
  }
  setup_shards();  // the blocks and the flat parameters (the parameters' old storage goes)
  for (size_t b = 0; b < layout_.size(); ++b) point_gradients(b);
  state_ = StepState::kIdle;
}

}  // namespace ddp
