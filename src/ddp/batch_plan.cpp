#include "ddp/batch_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/errors.h"

namespace ddp {

int64_t BatchPlan::per_rank_of(int64_t global_batch, int world_size, int rank) {
  return global_batch / world_size + (rank < global_batch % world_size ? 1 : 0);
}

BatchPlan BatchPlan::make(int64_t global_batch, int world_size, int rank, int64_t micro_batch) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw PlanError(fmt::format("invalid rank {} of world size {}", rank, world_size));
  }
  if (global_batch < 1) {
    throw PlanError(
        fmt::format("train.global_batch_size must be at least 1, got {}", global_batch));
  }
  if (global_batch < world_size) {
    throw PlanError(fmt::format(
        "train.global_batch_size = {} is smaller than the world size {}: every rank needs at least "
        "one sample per step. Raise the global batch to at least {} or start fewer ranks.",
        global_batch, world_size, world_size));
  }
  BatchPlan p;
  p.global_batch = global_batch;
  p.world_size = world_size;
  p.rank = rank;
  p.per_rank = per_rank_of(global_batch, world_size, rank);
  const int64_t base = global_batch / world_size;
  const int64_t extra = global_batch % world_size;
  p.offset = rank * base + std::min<int64_t>(rank, extra);
  p.micro_batch = micro_batch <= 0 ? p.per_rank : micro_batch;
  if (p.micro_batch > p.per_rank) {
    p.micro_clamped = micro_batch > 0;
    p.micro_batch = p.per_rank;
  }
  for (int64_t left = p.per_rank; left > 0; left -= p.micro_batch) {
    p.micro_sizes.push_back(std::min(left, p.micro_batch));
  }
  return p;
}

void BatchPlan::equalize_micro_batches(int64_t requested) {
  // Rank 0 holds the largest slice, so the most micro-batches.
  const auto count =
      static_cast<size_t>(make(global_batch, world_size, 0, requested).accumulation());
  while (micro_sizes.size() < count) {
    const auto most = std::max_element(micro_sizes.begin(), micro_sizes.end());
    if (most == micro_sizes.end() || *most < 2) {
      micro_sizes.insert(micro_sizes.begin(), 0);
      continue;
    }
    const int64_t half = *most / 2;
    *most -= half;
    micro_sizes.insert(most + 1, half);
  }
}

std::string BatchPlan::describe() const {
  const int64_t last = micro_sizes.empty() ? 0 : micro_sizes.back();
  return fmt::format("{} samples [{}, {}) in {} micro-batch(es) of {}{}", per_rank, offset,
                     offset + per_rank, accumulation(), micro_batch,
                     last != micro_batch ? fmt::format(" (last {})", last) : std::string());
}

}  // namespace ddp
