#include "memory/estimator.h"

#include <fmt/format.h>

#include <algorithm>

namespace memory {

int64_t MemoryEstimate::chunk_rows(int64_t micro) const {
  // The rows spread evenly over as few chunks as hold them (models/lm/linear_cross_entropy.h).
  const int64_t rows = micro * loss_rows_per_sample;
  if (rows <= 0 || loss_chunk_rows <= 0) return 0;
  const int64_t chunks = (rows + loss_chunk_rows - 1) / loss_chunk_rows;
  return (rows + chunks - 1) / chunks;
}

int64_t MemoryEstimate::peak(int64_t micro) const {
  return persistent() + loader + checkpoint_copy + activation_fixed +
         activation_per_sample * micro + activation_per_chunk_row * chunk_rows(micro);
}

std::string MemoryEstimate::describe(int64_t micro) const {
  constexpr double kMiB = 1048576.0;
  const std::string chunked =
      activation_per_chunk_row > 0
          ? fmt::format(" + the loss's chunk {:.1f} MiB ({} rows)",
                        activation_per_chunk_row * chunk_rows(micro) / kMiB, chunk_rows(micro))
          : "";
  return fmt::format(
      "parameters {:.1f} MiB, gradient buckets {:.1f} MiB, optimizer state {:.1f} MiB, caches "
      "{:.1f} MiB, other tensors {:.1f} MiB, loader {:.1f} MiB, {}activations {:.1f} MiB + {:.3f} "
      "MiB/sample{} -> peak {:.1f} MiB at micro-batch {}",
      parameters / kMiB, gradients / kMiB, optimizer_state / kMiB, caches / kMiB, other / kMiB,
      loader / kMiB,
      checkpoint_copy > 0 ? fmt::format("checkpoint host copy {:.1f} MiB, ", checkpoint_copy / kMiB)
                          : "",
      activation_fixed / kMiB, activation_per_sample / kMiB, chunked, peak(micro) / kMiB, micro);
}

void fit_activations(int64_t b1, int64_t peak1, int64_t b2, int64_t peak2, MemoryEstimate* e) {
  if (b2 <= b1) {
    // One size only: all of it per sample (an overestimate for small batches, never an under-).
    e->activation_fixed = 0;
    e->activation_per_sample = std::max<int64_t>(0, peak1) / std::max<int64_t>(1, b1);
    return;
  }
  const int64_t slope = std::max<int64_t>(0, (peak2 - peak1 + (b2 - b1) - 1) / (b2 - b1));
  e->activation_per_sample = slope;
  e->activation_fixed = std::max<int64_t>(0, peak1 - slope * b1);
}

void fit_activations_chunked(int64_t b1, int64_t peak1, int64_t x1, int64_t b2, int64_t peak2,
                             int64_t x2, int64_t peak3, int64_t x3, MemoryEstimate* e) {
  // peak = fixed + slope x b + per_row x chunk: peak1 - peak3 is the chunk's share at b1.
  const int64_t per_row =
      x3 < x1 ? std::max<int64_t>(0, (peak1 - peak3 + (x1 - x3) - 1) / (x1 - x3)) : 0;
  e->activation_per_chunk_row = per_row;
  if (b2 <= b1) {
    e->activation_fixed = 0;
    e->activation_per_sample =
        std::max<int64_t>(0, peak1 - per_row * x1) / std::max<int64_t>(1, b1);
    return;
  }
  // What the chunk added between the two sizes is not per sample.
  fit_activations(b1, peak1 - per_row * x1, b2, peak2 - per_row * x2, e);
}

int64_t largest_micro_batch(const MemoryEstimate& e, int64_t budget_bytes, int64_t per_rank) {
  if (e.activation_per_sample <= 0 && e.activation_per_chunk_row <= 0) return per_rank;
  // The chunk's rows fall where one more sample needs one more chunk, so peak() is not monotone:
  // walk down from the largest size (arithmetic only).
  for (int64_t micro = per_rank; micro > 1; --micro) {
    if (e.peak(micro) <= budget_bytes) return micro;
  }
  return 1;
}

}  // namespace memory
