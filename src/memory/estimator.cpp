#include "memory/estimator.h"

#include <fmt/format.h>

#include <algorithm>

namespace memory {

std::string MemoryEstimate::describe(int64_t micro) const {
  constexpr double kMiB = 1048576.0;
  return fmt::format(
      "parameters {:.1f} MiB, gradient buckets {:.1f} MiB, optimizer state {:.1f} MiB, caches "
      "{:.1f} MiB, other tensors {:.1f} MiB, loader {:.1f} MiB, activations {:.1f} MiB + {:.3f} "
      "MiB/sample -> peak {:.1f} MiB at micro-batch {}",
      parameters / kMiB, gradients / kMiB, optimizer_state / kMiB, caches / kMiB, other / kMiB,
      loader / kMiB,
      activation_fixed / kMiB, activation_per_sample / kMiB, peak(micro) / kMiB, micro);
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

int64_t largest_micro_batch(const MemoryEstimate& e, int64_t budget_bytes, int64_t per_rank) {
  if (e.activation_per_sample <= 0) return per_rank;
  const int64_t room = budget_bytes - e.peak(0);
  return std::clamp<int64_t>(room / e.activation_per_sample, 1, per_rank);
}

}  // namespace memory
