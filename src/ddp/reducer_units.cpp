// The parameter-sharded part of the Reducer (ddp.shard: parameters, ZeRO-3; see ddp/reducer.h):
// units as buckets, the master shards, and gathering and freeing a unit's parameters.
//
// Note [Freeing a unit's storage]
// A unit's parameters are views into one flat buffer (set_data at construction), and autograd
// saves such views (a matmul keeps its weight) until backward. Freeing the flat tensor would not
// free its bytes while those references live. Instead the storage itself is emptied: its data
// pointer is replaced by null and its size set to 0, and gathering allocates new bytes into the
// same StorageImpl (FSDP1's `_free_storage` / `_alloc_storage`). Every view, saved or not, then
// sees the new bytes: backward reads the parameters as gathered again for it. Nothing may read a
// parameter of a freed unit (the gate in train/unit_gate.h gathers before every use).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "ddp/reducer.h"

namespace ddp {
namespace {

void release_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t nbytes = flat.numel() * flat.element_size();
  if (s->nbytes() == nbytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

std::vector<BucketLayout> Reducer::unit_layout() const {
  std::vector<std::vector<size_t>> units = options_.units;
  if (units.empty()) {
    units.emplace_back();
    for (size_t k = 0; k < params_.size(); ++k) units.back().push_back(k);
  }
  std::vector<int> seen(params_.size(), 0);
  for (const auto& unit : units) {
    for (const size_t k : unit) {
      if (k >= params_.size() || seen[k]++ > 0) {
        throw ParameterError(fmt::format("ddp.shard: parameters: parameter #{} is in more than one "
                                         "unit (or no such parameter)",
                                         k));
      }
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (seen[k] == 0) {
      throw ParameterError(
          fmt::format("ddp.shard: parameters: parameter '{}' is in none of the model's units",
                      params_[k].first));
    }
  }
  // The last unit's gradients are ready first in backward: its bucket comes first. Within a unit,
  // parameters in reverse registration order, as assign_buckets lays them out.
  // A unit without parameters (LoRA: a frozen unit's weights are buffers) still has a bucket,
  // empty, on the parameters' device: its master joins the optimizer's blocks.
  std::vector<BucketLayout> layout;
  for (auto u = units.rbegin(); u != units.rend(); ++u) {
    BucketLayout bucket;
    if (!params_.empty()) {
      bucket.dtype = params_.front().second.scalar_type();
      bucket.device = params_.front().second.device();
    }
    std::vector<size_t> members = *u;
    std::sort(members.rbegin(), members.rend());
    for (const size_t k : members) {
      const at::Tensor& p = params_[k].second;
      if (bucket.params.empty()) {
        bucket.dtype = p.scalar_type();
        bucket.device = p.device();
      } else if (p.scalar_type() != bucket.dtype || p.device() != bucket.device) {
        throw ParameterError(fmt::format("ddp.shard: parameters: parameter '{}' differs in dtype "
                                         "or device from the rest of its unit",
                                         params_[k].first));
      }
      bucket.params.push_back(k);
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += p.numel();
    }
    layout.push_back(std::move(bucket));
  }
  return layout;
}

void Reducer::setup_masters() {
  unit_bucket_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    unit_bucket_[buckets_.size() - 1 - b] = b;
    bucket.master =
        at::zeros({bucket.shard.size},
                  at::TensorOptions().dtype(bucket.layout.dtype).device(bucket.layout.device));
    bucket.gathered = true;  // until reshard_parameters() (deferred: until setup_shards)
  }
  if (options_.frozen.empty()) return;
  if (options_.frozen.size() > unit_bucket_.size()) {
    throw ParameterError(fmt::format("ddp.shard: parameters: frozen tensors for {} units of {}",
                                     options_.frozen.size(), unit_bucket_.size()));
  }
  for (size_t u = 0; u < options_.frozen.size(); ++u) {
    setup_frozen(buckets_[unit_bucket_[u]], options_.frozen[u]);
  }
}

void Reducer::setup_frozen(Bucket& bucket, NamedParameters tensors) {
  Frozen& f = bucket.frozen;
  f.tensors = std::move(tensors);
  if (f.tensors.empty()) return;
  f.layout.dtype = f.tensors.front().second.scalar_type();
  f.layout.device = f.tensors.front().second.device();
  for (size_t j = 0; j < f.tensors.size(); ++j) {
    const auto& [name, t] = f.tensors[j];
    if (t.scalar_type() != f.layout.dtype || t.device() != f.layout.device) {
      throw ParameterError(fmt::format("ddp.shard: parameters: frozen tensor '{}' differs in "
                                       "dtype or device from the rest of its unit",
                                       name));
    }
    f.layout.params.push_back(j);
    f.layout.offsets.push_back(f.layout.numel);
    f.layout.numel += t.numel();
  }
  f.shard = shard_bucket(f.layout.numel, comm_.size(), comm_.rank());
  const auto options = at::TensorOptions().dtype(f.layout.dtype).device(f.layout.device);
  f.master = at::zeros({f.shard.size}, options);
  f.full = at::empty({f.shard.padded}, options);
  // The same tensors (the model's buffers), new storage: each a view into the flat buffer.
  // Deferred (no values yet), the buffer is never touched and setup_shards frees it at once.
  const bool deferred = options_.deferred;
  if (!deferred) f.full.narrow(0, f.layout.numel, f.shard.padded - f.layout.numel).zero_();
  for (size_t j = 0; j < f.tensors.size(); ++j) {
    at::Tensor& t = f.tensors[j].second;
    at::Tensor piece = f.full.narrow(0, f.layout.offsets[j], t.numel());
    at::Tensor view =
        t.is_contiguous() ? piece.view(t.sizes()) : piece.as_strided(t.sizes(), t.strides());
    if (!deferred) view.copy_(t.detach());
    t.set_data(view);
  }
  if (deferred) {  // one unit's bytes at a time, never touched
    release_storage(f.full);
    f.gathered = false;
  }
}

void Reducer::reshard_parameters() {
  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    bucket.master.copy_(bucket.parameters.narrow(0, bucket.shard.begin, bucket.shard.size));
    Frozen& f = bucket.frozen;
    if (f.full.defined()) f.master.copy_(f.full.narrow(0, f.shard.begin, f.shard.size));
    release_unit(bucket);
  }
  resharded_ = true;
}

void Reducer::masters_filled() {
  std::lock_guard<std::mutex> lock(mutex_);
  resharded_ = true;
}

bool Reducer::any_rank(bool mine, const std::string& what) {
  if (comm_.size() == 1) return mine;
  const auto device = buckets_.empty() ? c10::Device(c10::kCPU) : buckets_.front().layout.device;
  at::Tensor flag = at::full({1}, mine ? 1.0F : 0.0F, at::TensorOptions().device(device));
  comm_.all_reduce(flag, ReduceOp::kMax, what);
  return flag.item<float>() > 0;
}

void Reducer::begin_unit_pass() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Bucket& bucket : buckets_) {
    bucket.unit_pending = static_cast<int64_t>(bucket.layout.params.size());
    bucket.landed = false;
  }
}

void Reducer::land_unit(size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  Bucket& bucket = buckets_[unit_bucket_.at(unit)];
  if (state_ == StepState::kSyncing) {
    for (const size_t k : bucket.layout.params) {
      if (ready_[k]) continue;
      ready_[k] = 1;
      --bucket.pending;
    }
    post_ready_buckets();
    drive_progress();
  }
  bucket.unit_pending = static_cast<int64_t>(bucket.layout.params.size());
  bucket.landed = true;
  if (resharded_ && !bucket.frozen.full.defined()) release_unit(bucket);
  if (state_ == StepState::kAccumulating && (!resharded_ || discard_gradients_)) {
    release_bucket(bucket);
  }
}

int64_t Reducer::largest_unit_bytes() const {
  int64_t most = 0;
  for (const Bucket& bucket : buckets_) {
    const Frozen& f = bucket.frozen;
    most = std::max<int64_t>(most, bucket.shard.padded * c10::elementSize(bucket.layout.dtype) +
                                       f.shard.padded * c10::elementSize(f.layout.dtype));
  }
  return most;
}

int64_t Reducer::frozen_shard_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_) {
    if (bucket.frozen.master.defined()) bytes += bucket.frozen.master.nbytes();
  }
  return bytes;
}

void Reducer::post_gather(size_t b, bool frozen) {
  Bucket& bucket = buckets_[b];
  Frozen& f = bucket.frozen;
  const bool parameters = !bucket.gathered;
  const bool tensors = frozen && f.full.defined() && !f.gathered;
  if (!parameters && !tensors) return;
  if (parameters) allocate_storage(bucket.parameters);
  if (tensors) allocate_storage(f.full);
  bucket.gathered = true;
  f.gathered = f.gathered || tensors;
  const size_t unit = buckets_.size() - 1 - b;
  if (parameters) {
    post_flat_gather(bucket.parameters, bucket.master, bucket.gather,
                     fmt::format("parameters of unit {}", unit));
  }
  if (tensors) {
    post_flat_gather(f.full, f.master, f.gather, fmt::format("frozen tensors of unit {}", unit));
  }
}

void Reducer::post_flat_gather(const at::Tensor& full, const at::Tensor& master, Gather& gather,
                               const std::string& what) {
  if (comm_.size() == 1) {
    full.copy_(master);
    return;
  }
  const auto dtype = options_.gather_dtype;
  if (dtype == c10::ScalarType::Undefined || dtype == full.scalar_type()) {
    gather.work = comm_.all_gather_async(full, master, what);
    return;
  }
  gather.master_wire = master.to(dtype);
  gather.wire = at::empty({full.numel()}, gather.master_wire.options());
  gather.work = comm_.all_gather_async(gather.wire, gather.master_wire, what);
}

void Reducer::finish_gather(Bucket& bucket) {
  const auto finish = [](const at::Tensor& full, Gather& gather) {
    if (!gather.work) return;
    gather.work->wait();
    gather.work.reset();
    if (!gather.wire.defined()) return;
    full.copy_(gather.wire);  // the compute dtype's values, in the full buffer's dtype
    gather.wire = at::Tensor();
    gather.master_wire = at::Tensor();
  };
  finish(bucket.parameters, bucket.gather);
  finish(bucket.frozen.full, bucket.frozen.gather);
}

void Reducer::release_unit(Bucket& bucket) {
  if (!bucket.gathered) return;
  finish_gather(bucket);
  release_storage(bucket.parameters);
  if (bucket.frozen.full.defined() && bucket.frozen.gathered) release_storage(bucket.frozen.full);
  bucket.gathered = false;
  bucket.frozen.gathered = false;
}

void Reducer::prefetch_unit(size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  post_gather(unit_bucket_.at(unit));
}

void Reducer::gather_unit(size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  Bucket& bucket = buckets_[unit_bucket_.at(unit)];
  post_gather(unit_bucket_[unit]);
  finish_gather(bucket);
}

void Reducer::free_unit(size_t unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_unit(buckets_[unit_bucket_.at(unit)]);
}

void Reducer::gather_all_units(bool frozen) {
  for (size_t u = 0; u < unit_bucket_.size(); ++u) {
    std::lock_guard<std::mutex> lock(mutex_);
    post_gather(unit_bucket_[u], frozen);
  }
  for (size_t u = 0; u < unit_bucket_.size(); ++u) {
    std::lock_guard<std::mutex> lock(mutex_);
    finish_gather(buckets_[unit_bucket_[u]]);
  }
}

void Reducer::free_all_units() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Bucket& bucket : buckets_) release_unit(bucket);
}

void Reducer::on_unit_gradient(size_t param) {
  Bucket& bucket = buckets_[bucket_of_[param]];
  if (--bucket.unit_pending > 0) return;
  // The unit's parameters are done with (counted again from here: the probe runs several
  // backwards); its backward is over unless it holds frozen tensors, whose uses in the gradient
  // of its input may come later (a norm's weight after the adapters of the projection it feeds):
  // the gate frees such a unit (train/unit_gate.h).
  bucket.unit_pending = static_cast<int64_t>(bucket.layout.params.size());
  bucket.landed = true;
  if (resharded_ && !bucket.frozen.full.defined()) release_unit(bucket);
  if (state_ == StepState::kAccumulating && (!resharded_ || discard_gradients_)) {
    // The start-up's probe (on the whole model before reshard_parameters(), or unit by unit from
    // a deferred build) discards its gradients: a unit's full gradient lives only through its
    // backward, as in a synced step.
    release_bucket(bucket);
  }
}

}  // namespace ddp
