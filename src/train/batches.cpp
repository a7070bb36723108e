#include "train/batches.h"

#include <algorithm>

namespace train {

Batches::Batches(const data::Dataset& dataset, const TrainOptions& train,
                 const data::LoaderOptions& loader, int world, int rank, c10::Device device)
    : dataset_(dataset), train_(train), loader_options_(loader), world_(world), rank_(rank),
      device_(device), micro_batch_(0),
      plan_(ddp::BatchPlan::make(train.global_batch_size, world, rank, train.micro_batch_size)),
      sampler_(dataset.size(), train.global_batch_size, train.seed) {
  loader_options_.pin_memory = device.is_cuda();
  const int64_t largest_slice = (train.global_batch_size + world - 1) / world;
  micro_batch_ =
      train.micro_batch_size > 0 ? std::min(train.micro_batch_size, largest_slice) : largest_slice;
}

void Batches::replan(int64_t micro_batch, bool equal_counts) {
  plan_ = ddp::BatchPlan::make(train_.global_batch_size, world_, rank_, micro_batch);
  if (equal_counts) plan_.equalize_micro_batches(micro_batch);
}

void Batches::set_micro_batch(int64_t micro_batch, bool equal_counts) {
  micro_batch_ = micro_batch;
  replan(micro_batch, equal_counts);
}

void Batches::plan_configured(bool equal_counts) { replan(train_.micro_batch_size, equal_counts); }

void Batches::start() {
  // The loader reads this rank's slice of each step; the slice (offset, size) never changes with
  // the micro-batch, so a fallback keeps reading the same samples.
  const int64_t offset = plan_.offset, per_rank = plan_.per_rank;
  loader_ = std::make_unique<data::Loader>(
      dataset_,
      [this, offset, per_rank](int64_t batch) { return sampler_.indices(batch, offset, per_rank); },
      loader_options_);
}

data::Batch Batches::micro_batch(const data::Batch& batch, int64_t offset, int64_t n) const {
  // An empty micro-batch (BatchPlan::equalize_micro_batches) runs on the slice's last sample with
  // weight 0 (plan_.weight(0)): the same gathers as the other ranks' micro-batch, no gradient.
  if (n == 0) return data::to_device(batch, plan_.per_rank - 1, 1, device_);
  return data::to_device(batch, offset, n, device_);
}

data::Batch Batches::first_slice() {
  return dataset_.get(sampler_.indices(0, plan_.offset, plan_.per_rank));
}

int64_t Batches::host_bytes(int64_t step_bytes) const {
  return sampler_.buffer_bytes() + data::Loader::buffer_bytes(loader_options_, step_bytes);
}

}  // namespace train
