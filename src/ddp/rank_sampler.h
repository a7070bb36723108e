// RankSampler: which dataset samples form global step s, and which of them a rank takes.
//
// Each epoch is a permutation of the dataset seeded by (seed, epoch); global step s takes
// positions [s*G, (s+1)*G) of its epoch's permutation (an epoch has floor(N/G) steps; the tail is
// dropped). A rank takes positions [offset, offset + count) of that window (BatchPlan). The
// samples of step s depend only on (N, G, seed), never on the world size or micro-batch.
//
// A mixture of sources (data.mixture; each source a range of the dataset's indices) is drawn by
// weight instead: step s takes positions [s*G, (s+1)*G) of the run's stream, position p being
// the sample ddp/mixture_order.h gives (a source's samples in a new order for each of its
// passes), so the samples of step s depend only on (the sources, their weights, G, seed).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/mixture_order.h"

namespace ddp {

// One source of a mixture: its samples are the dataset's indices [first, first + size).
struct MixtureSlice {
  int64_t first = 0;
  int64_t size = 0;
  double weight = 0;
};

class RankSampler {
 public:
  // Throws PlanError when the dataset is smaller than one global batch.
  RankSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed);
  // A mixture of `sources` (their indices together the dataset's).
  RankSampler(const std::vector<MixtureSlice>& sources, int64_t global_batch, uint64_t seed);

  // Steps in one pass over the dataset (a mixture: over all its sources' samples).
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // Dataset indices (int64, CPU) of positions [offset, offset+count) of global step `step`: a
  // view into the epoch's permutation (a mixture: into a buffer of `count`), valid until the next
  // call that starts another epoch (a mixture: the next call).
  at::Tensor indices(int64_t step, int64_t offset, int64_t count);

  // A mixture: the order, and the first step (from 0) that draws a second pass of source `k`
  // (-1: none).
  const MixtureOrder* mixture() const { return order_.get(); }
  int64_t first_wrap_step(size_t k) const;

  // Bytes the sampler holds: the epoch permutation (N x int64), allocated by the first indices()
  // call and reused by every later epoch; a mixture: its order's table and a step's slice.
  int64_t buffer_bytes() const;

 private:
  int64_t dataset_size_;
  int64_t global_batch_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  int64_t epoch_ = -1;
  at::Tensor permutation_;
  std::unique_ptr<MixtureOrder> order_;
  std::vector<int64_t> first_;  // a mixture: each source's first index
  at::Tensor drawn_;            // a mixture: the last indices() result
};

}  // namespace ddp
