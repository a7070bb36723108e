#include "ddp/rank_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "ddp/errors.h"

namespace ddp {

RankSampler::RankSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed)
    : dataset_size_(dataset_size), global_batch_(global_batch), seed_(seed),
      steps_per_epoch_(global_batch > 0 ? dataset_size / global_batch : 0) {
  if (steps_per_epoch_ < 1) {
    throw PlanError(fmt::format(
        "the dataset has {} samples, fewer than one global batch (train.global_batch_size = {})",
        dataset_size, global_batch));
  }
}

at::Tensor RankSampler::indices(int64_t step, int64_t offset, int64_t count) {
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

}  // namespace ddp
