// What every evaluation (validation loss, ranking metrics, multiple-choice tasks) needs before it
// walks its items: this rank's contiguous slice of them and the device the model computes on.
#pragma once

#include <c10/core/Device.h>

#include <algorithm>
#include <cstdint>

#include "models/model.h"

namespace train {

// This rank's contiguous slice [begin, begin + count) of n items: BatchPlan's rule (docs/DESIGN.md,
// "Global batch semantics"), the first n % world ranks one more; empty slices allowed.
struct EvalSlice {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
};
inline EvalSlice eval_slice(int64_t n, int world, int rank) {
  const int64_t base = n / world, extra = n % world;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

// The device of the model's parameters (the CPU for a model without any).
inline c10::Device model_device(models::Model& model) {
  const auto params = model.parameters();
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

}  // namespace train
