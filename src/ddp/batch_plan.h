// BatchPlan: how one rank takes its part of the global batch (see docs/DESIGN.md, "Global batch
// semantics"). Rank r of W takes a contiguous slice of G/W samples of each global batch, the first
// G mod W ranks one more, and walks it in micro-batches; each micro-batch's loss is weighted by its
// share of the global batch, so a SUM all-reduce yields the gradient of the global mean.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct BatchPlan {
  int64_t global_batch = 0;
  int world_size = 1;
  int rank = 0;
  int64_t per_rank = 0;              // samples this rank takes from each global batch
  int64_t offset = 0;                // where its slice starts within the global batch
  int64_t micro_batch = 0;           // largest micro-batch
  bool micro_clamped = false;        // the requested micro-batch exceeded per_rank and was clamped
  std::vector<int64_t> micro_sizes;  // in order; they sum to per_rank

  int64_t accumulation() const { return static_cast<int64_t>(micro_sizes.size()); }
  // The weight of a micro-batch of n samples: its share of the global batch.
  double weight(int64_t n) const { return static_cast<double>(n) / global_batch; }

  // `micro_batch` <= 0 means the whole per-rank slice in one micro-batch.
  // Throws PlanError when the world is larger than the global batch.
  static BatchPlan make(int64_t global_batch, int world_size, int rank, int64_t micro_batch);

  // Samples rank `rank` of `world_size` takes from a global batch.
  static int64_t per_rank_of(int64_t global_batch, int world_size, int rank);

  // ddp.shard: parameters gathers the model once per micro-batch, so every rank must run the
  // same number of micro-batches: the largest rank's count. Splits this rank's largest
  // micro-batches until it has as many; a rank with fewer samples than that gets empty
  // micro-batches (size 0) at the front, which the trainer runs on one of its samples with
  // weight 0 (the same gathers, no contribution).
  // `micro_batch`: the one this plan was made with (make()'s, before clamping to the slice).
  void equalize_micro_batches(int64_t micro_batch);

  std::string describe() const;
};

}  // namespace ddp
