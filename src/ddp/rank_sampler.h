// RankSampler: which dataset samples form global step s, and which of them a rank takes.
//
// Each epoch is a permutation of the dataset seeded by (seed, epoch); global step s takes
// positions [s*G, (s+1)*G) of its epoch's permutation (an epoch has floor(N/G) steps; the tail is
// dropped). A rank takes positions [offset, offset + count) of that window (BatchPlan). The
// samples of step s depend only on (N, G, seed), never on the world size or micro-batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ddp {

class RankSampler {
 public:
  // Throws PlanError when the dataset is smaller than one global batch.
  RankSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // Dataset indices (int64, CPU) of positions [offset, offset+count) of global step `step`: a
  // view into the epoch's permutation, valid until the next epoch starts.
  at::Tensor indices(int64_t step, int64_t offset, int64_t count);

  // Bytes of the epoch permutation (N x int64): allocated by the first indices() call and
  // reused by every later epoch.
  int64_t buffer_bytes() const { return dataset_size_ * static_cast<int64_t>(sizeof(int64_t)); }

 private:
  int64_t dataset_size_;
  int64_t global_batch_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  int64_t epoch_ = -1;
  at::Tensor permutation_;
};

}  // namespace ddp
