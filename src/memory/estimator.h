// The memory plan of one rank: what it will hold during a step, by kind, and the largest
// micro-batch that fits a memory target. Activations come from a probe (the peak of forward +
// backward at two micro-batch sizes, fitted as fixed + slope x batch); everything else is counted.
// Pure arithmetic: the Trainer measures, this adds up.
#pragma once

#include <cstdint>
#include <string>

namespace memory {

struct MemoryEstimate {
  int64_t parameters = 0;        // parameters and buffers
  int64_t gradients = 0;         // gradient buckets
  int64_t optimizer_state = 0;   // AdamW: two moments per parameter, in its dtype
  int64_t caches = 0;            // embedding caches (released by uncache_embeddings)
  int64_t other = 0;             // other live tensors on the device (e.g. an in-memory data set)
  int64_t loader = 0;            // the sampler's epoch permutation and this rank's batch as
                                 // loaded (host memory: counted on CPU runs only)
  int64_t activation_fixed = 0;  // activation peak independent of the micro-batch
  int64_t activation_per_sample = 0;

  int64_t persistent() const { return parameters + gradients + optimizer_state + caches + other; }
  // Peak tensor memory of a step at micro-batch `micro`.
  int64_t peak(int64_t micro) const {
    return persistent() + loader + activation_fixed + activation_per_sample * micro;
  }
  std::string describe(int64_t micro) const;
};

// Fits fixed + slope x batch through two probe peaks (b1 < b2); slope and fixed are clamped at 0.
void fit_activations(int64_t b1, int64_t peak1, int64_t b2, int64_t peak2, MemoryEstimate* e);

// The largest micro-batch in [1, per_rank] whose peak fits `budget_bytes`; 1 when none does
// (the OOM fallback is the safety net), per_rank when the slope is 0.
int64_t largest_micro_batch(const MemoryEstimate& e, int64_t budget_bytes, int64_t per_rank);

}  // namespace memory
