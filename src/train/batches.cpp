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
  const auto stats = dataset.packing();
  packed_ = stats && stats->packing == data::Packing::kDocuments;
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
  loader_ = std::make_unique<data::Loader>(
      dataset_, [this](int64_t batch) { return take_indices(batch); }, loader_options_);
}

at::Tensor Batches::take_indices(int64_t index) {
  const at::Tensor all = sampler_.indices(index, 0, train_.global_batch_size);
  const at::Tensor mine = all.narrow(0, plan_.offset, plan_.per_rank);
  StepTargets t{dataset_.target_count(all), mine.clone()};
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  targets_[index] = std::move(t);
  return mine;
}

data::Batch Batches::get(int64_t index) {
  data::Batch batch = loader_->get(index);
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  targets_.erase(targets_.begin(), targets_.lower_bound(index));  // steps passed
  return batch;
}

double Batches::weight(int64_t index, int64_t offset, int64_t n) const {
  if (n == 0) return 0.0;
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  const StepTargets& t = targets_.at(index);
  const int64_t mine = dataset_.target_count(t.indices.narrow(0, offset, n));
  return static_cast<double>(mine) / static_cast<double>(std::max<int64_t>(1, t.global));
}

data::Batch Batches::micro_batch(const data::Batch& batch, int64_t offset, int64_t n) const {
  // An empty micro-batch (BatchPlan::equalize_micro_batches) runs on the slice's last sample with
  // weight 0 (weight(.., 0)): the same gathers as the other ranks' micro-batch, no gradient.
  if (n == 0) offset = plan_.per_rank - 1, n = 1;
  data::Batch micro = data::to_device(batch, offset, n, device_);
  if (micro.positions.defined() && device_.is_cuda()) {
    micro.positions = batch.positions.narrow(0, offset, n);
  }
  return micro;
}

data::Batch Batches::first_slice() {
  return dataset_.get(sampler_.indices(0, plan_.offset, plan_.per_rank));
}

int64_t Batches::host_bytes(int64_t step_bytes) const {
  return sampler_.buffer_bytes() + data::Loader::buffer_bytes(loader_options_, step_bytes);
}

}  // namespace train
