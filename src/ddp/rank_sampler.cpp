#include "ddp/rank_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "ddp/errors.h"

namespace ddp {
namespace {

int64_t steps_per_epoch_of(int64_t dataset_size, int64_t global_batch) {
  const int64_t steps = global_batch > 0 ? dataset_size / global_batch : 0;
  if (steps < 1) {
    throw PlanError(fmt::format(
        "the dataset has {} samples, fewer than one global batch (train.global_batch_size = {})",
        dataset_size, global_batch));
  }
  return steps;
}

int64_t total_size(const std::vector<MixtureSlice>& sources) {
  int64_t n = 0;
  for (const auto& s : sources) n += s.size;
  return n;
}

}  // namespace

RankSampler::RankSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed)
    : dataset_size_(dataset_size), global_batch_(global_batch), seed_(seed),
      steps_per_epoch_(steps_per_epoch_of(dataset_size, global_batch)) {}

RankSampler::RankSampler(const std::vector<MixtureSlice>& sources, int64_t global_batch,
                         uint64_t seed)
    : dataset_size_(total_size(sources)), global_batch_(global_batch), seed_(seed),
      steps_per_epoch_(steps_per_epoch_of(dataset_size_, global_batch)) {
  std::vector<double> weights;
  std::vector<int64_t> sizes;
  for (const auto& s : sources) {
    weights.push_back(s.weight);
    sizes.push_back(s.size);
    first_.push_back(s.first);
  }
  order_ = std::make_unique<MixtureOrder>(std::move(weights), std::move(sizes), seed);
}

at::Tensor RankSampler::indices(int64_t step, int64_t offset, int64_t count) {
  if (order_ != nullptr) {
    if (!drawn_.defined() || drawn_.numel() != count) drawn_ = at::empty({count}, at::kLong);
    int64_t* out = drawn_.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const auto [k, sample] = order_->at(step * global_batch_ + offset + i);
      out[i] = first_[k] + sample;
    }
    return drawn_;
  }
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != epoch_) {
    // Distinct, well-mixed seeds per epoch (splitmix64 constant).
    auto gen =
        at::make_generator<at::CPUGeneratorImpl>(seed_ + 0x9E3779B97F4A7C15ULL * (epoch + 1));
    // Into the same storage every epoch: the permutation is a loader buffer allocated once
    // (docs/DESIGN.md, "The OOM protocol"), not a new N x 8 bytes at each epoch boundary.
    if (!permutation_.defined()) permutation_ = at::empty({dataset_size_}, at::kLong);
    at::randperm_out(permutation_, dataset_size_, gen);
    epoch_ = epoch;
  }
  const int64_t start = (step % steps_per_epoch_) * global_batch_ + offset;
  return permutation_.slice(0, start, start + count);
}

int64_t RankSampler::first_wrap_step(size_t k) const {
  const int64_t p = order_ != nullptr ? order_->first_wrap(k) : -1;
  return p < 0 ? -1 : p / global_batch_;
}

int64_t RankSampler::buffer_bytes() const {
  if (order_ != nullptr) return order_->bytes() + global_batch_ * int64_t(sizeof(int64_t));
  return dataset_size_ * static_cast<int64_t>(sizeof(int64_t));
}

}  // namespace ddp
