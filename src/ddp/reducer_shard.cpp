// The sharded part of the Reducer (ddp.shard: optimizer | gradients; see ddp/reducer.h): the
// per-bucket blocks, the flat parameters, ZeRO-2's per-step buckets, and the conversions between
// per-bucket blocks and full per-parameter tensors (checkpoints).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "ddp/reducer.h"

namespace ddp {

void Reducer::setup_shards() {
  const auto options = [](const Bucket& bucket, at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(bucket.layout.device);
  };
  // Every allocation before any parameter moves (the OOM rule of the constructor); ZeRO-3 moves
  // the parameters unit by unit instead, so that the copy adds one unit, not the whole model (a
  // failure there ends the start-up anyway: the Trainer's allocation vote).
  for (Bucket& bucket : buckets_) {
    if (!shards_parameters()) {
      bucket.parameters = at::zeros({bucket.shard.padded}, options(bucket, bucket.layout.dtype));
    }
    // One rank, ZeRO-1: the block is the whole bucket; nothing to copy.
    bucket.reduced = comm_.size() == 1 && !shards_gradients()
                         ? bucket.gradients
                         : at::zeros({bucket.shard.size}, options(bucket, bucket.layout.dtype));
    bucket.wire_reduced =
        has_wire(bucket) ? at::zeros({bucket.shard.size}, options(bucket, options_.reduce_dtype))
                         : at::Tensor();
  }
  // The parameters become views into the flat buffers: the same Variables (the model, the
  // optimizer and autograd keep them), new storage. Deferred (no values yet), each unit's buffer
  // is allocated only to make the views, never touched, and freed at once.
  at::NoGradGuard no_grad;
  if (shards_parameters()) setup_masters();
  const bool deferred = shards_parameters() && options_.deferred;
  for (Bucket& bucket : buckets_) {
    if (shards_parameters()) {
      const auto o = options(bucket, bucket.layout.dtype);
      bucket.parameters =
          deferred ? at::empty({bucket.shard.padded}, o) : at::zeros({bucket.shard.padded}, o);
    }
    for (size_t j = 0; j < bucket.layout.params.size(); ++j) {
      at::Tensor& p = params_[bucket.layout.params[j]].second;
      at::Tensor view = param_view(bucket.parameters, bucket.layout, j);
      if (!deferred) view.copy_(p.detach());
      p.set_data(view);
    }
    if (deferred) release_unit(bucket);
  }
}

void Reducer::acquire_bucket(Bucket& bucket) {
  if (bucket.gradients.defined()) return;
  const auto options = at::TensorOptions().device(bucket.layout.device);
  bucket.gradients = at::zeros({bucket.shard.padded}, options.dtype(bucket.layout.dtype));
  if (has_wire(bucket)) {
    bucket.wire = at::empty({bucket.shard.padded}, options.dtype(options_.reduce_dtype));
  }
  point_gradients(bucket);
}

void Reducer::release_bucket(Bucket& bucket) {
  if (!bucket.gradients.defined()) return;
  for (size_t k : bucket.layout.params) params_[k].second.mutable_grad() = at::Tensor();
  bucket.work.reset();  // an MPI work keeps its input alive
  bucket.gradients = at::Tensor();
  bucket.wire = at::Tensor();
}

int64_t Reducer::gradient_bytes() const {
  int64_t bytes = communication_bytes();
  for (const Bucket& bucket : buckets_) {
    if (bucket.gradients.defined()) bytes += bucket.gradients.nbytes();
    if (!sharded()) continue;
    if (!bucket.reduced.is_same(bucket.gradients)) bytes += bucket.reduced.nbytes();
    if (bucket.wire_reduced.defined()) bytes += bucket.wire_reduced.nbytes();
  }
  return bytes;
}

std::vector<at::Tensor> Reducer::reduced_gradients() const {
  std::vector<at::Tensor> out;
  for (const Bucket& bucket : buckets_) {
    out.push_back(sharded() ? bucket.reduced : bucket.gradients);
  }
  return out;
}

std::vector<at::Tensor> Reducer::parameter_shards() const {
  std::vector<at::Tensor> out;
  if (!sharded()) return out;
  for (const Bucket& bucket : buckets_) {
    out.push_back(shards_parameters()
                      ? bucket.master
                      : bucket.parameters.narrow(0, bucket.shard.begin, bucket.shard.size));
  }
  return out;
}

void Reducer::reduce_replicas() {
  Communicator* replicas = options_.replicas;
  if (!sharded() || replicas == nullptr || replicas->size() == 1) return;
  // After the node's reduce-scatters, in bucket order on every rank (not in completion order,
  // which differs between ranks): each rank's block summed with the same block on the other
  // nodes, so the sum spans the world. All in flight at once, then waited for.
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    works.push_back(replicas->all_reduce_async(buckets_[b].reduced, ReduceOp::kSum,
                                               fmt::format("bucket {} across nodes", b)));
  }
  for (auto& w : works) w->wait();
}

void Reducer::gather_parameters() {
  // shard parameters: the masters are the parameters; units are gathered when used.
  if (!sharded() || comm_.size() == 1 || shards_parameters()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Every bucket in flight at once, in bucket order on every rank.
  std::vector<WorkPtr> works;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    works.push_back(comm_.all_gather_async(
        bucket.parameters, bucket.parameters.narrow(0, bucket.shard.begin, bucket.shard.size),
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
  const bool mine = root < 0 || comm_.rank() == root;
  if (mine) out.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    at::Tensor full = at::empty({bucket.shard.padded}, blocks[b].options());
    if (comm_.size() > 1) {
      comm_.all_gather(full, blocks[b], fmt::format("optimizer state of bucket {}", b));
    } else {
      full.copy_(blocks[b]);
    }
    if (!mine) continue;
    for (size_t j = 0; j < bucket.layout.params.size(); ++j) {
      const at::Tensor piece = param_view(full, bucket.layout, j);
      out[bucket.layout.params[j]] =
          root < 0 ? piece.clone() : piece.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const BucketShard& shard = buckets_[b].shard;
    at::Tensor flat = flat_bucket(full, layout_[b], blocks[b].options());
    const std::string what = fmt::format("optimizer state of bucket {}", b);
    // Hybrid: rank 0 of the world is rank 0 of its node and of its replicas; the other nodes'
    // first ranks get the state from it before their nodes do.
    Communicator* replicas = options_.replicas;
    if (replicas != nullptr && replicas->size() > 1 && comm_.rank() == 0) {
      replicas->broadcast(flat, 0, what);
    }
    if (comm_.size() > 1) comm_.broadcast(flat, 0, what);
    blocks[b].copy_(flat.narrow(0, shard.begin, shard.size));
  }
}

std::vector<at::Tensor> Reducer::blocks_of(const std::vector<at::Tensor>& full) const {
  if (full.size() != params_.size()) {
    throw std::logic_error("Reducer::blocks_of: one tensor per parameter");
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> blocks;
  for (const BucketLayout& layout : layout_) {
    const BucketShard shard = shard_bucket(layout.numel, comm_.size(), comm_.rank());
    // One bucket's flat copy at a time: the extra memory is one bucket. A unit without
    // parameters (LoRA: a frozen unit) has an empty block in the bucket's dtype and device.
    const auto options = layout.params.empty()
                             ? at::TensorOptions().dtype(layout.dtype).device(layout.device)
                             : full[layout.params[0]].options();
    blocks.push_back(
        flat_bucket(&full, layout, options).narrow(0, shard.begin, shard.size).clone());
  }
  return blocks;
}

at::Tensor Reducer::flat_bucket(const std::vector<at::Tensor>* full, const BucketLayout& layout,
                                const at::TensorOptions& options) const {
  const int64_t padded = shard_bucket(layout.numel, comm_.size(), comm_.rank()).padded;
  at::Tensor flat = at::zeros({padded}, options);
  if (full != nullptr) {
    for (size_t j = 0; j < layout.params.size(); ++j) {
      param_view(flat, layout, j).copy_((*full)[layout.params[j]]);
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
  for (Bucket& bucket : buckets_) {
    bucket.shard = shard_bucket(bucket.layout.numel, comm_.size(), comm_.rank());
  }
  // Sharded buckets are padded to a multiple of the world size: an unpadded one is replaced (its
  // contents belong to the abandoned step), the old freed before the new is allocated.
  rider_ = at::Tensor();  // a reduce-scatter would scatter its sum
  for (Bucket& bucket : buckets_) {
    bucket.work.reset();  // an MPI work keeps its buffers alive
    const bool rode = bucket.carried.numel() != bucket.gradients.numel();
    if (bucket.gradients.numel() == bucket.shard.padded && !rode) continue;
    for (size_t k : bucket.layout.params) params_[k].second.mutable_grad() = at::Tensor();
    const auto options = bucket.gradients.options();
    bucket.carried = at::Tensor();
    bucket.gradients = at::Tensor();
    bucket.gradients = at::zeros({bucket.shard.padded}, options);
    bucket.carried = bucket.gradients;
    if (bucket.wire.defined()) {
      const auto wire_options = bucket.wire.options();
      bucket.wire = at::Tensor();
      bucket.wire = at::zeros({bucket.shard.padded}, wire_options);
    }
  }
  setup_shards();  // the blocks and the flat parameters (the parameters' old storage goes)
  for (const Bucket& bucket : buckets_) point_gradients(bucket);
  state_ = StepState::kIdle;
}

}  // namespace ddp
