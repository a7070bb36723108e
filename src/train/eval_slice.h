// What every evaluation (validation loss, ranking metrics, multiple-choice tasks) needs before it
// walks its items: this rank's contiguous slice of them and the device the model computes on; and
// after them, before its all-reduce, settle_units.
#pragma once

#include <c10/core/Device.h>

#include <algorithm>
#include <cstdint>

#include "models/capabilities.h"
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

// Before an evaluation's all-reduce: under ddp.shard: parameters in step, waits until every rank
// has run its slice's forwards, gathering units for those that still run some (ranks' slices take
// different numbers of forwards; models::UnitGate::settle, Note [Units in step]). Collective.
inline void settle_units(models::Model& model) {
  auto* units = models::as<models::ParameterUnits>(model);
  if (units != nullptr && units->unit_gate() != nullptr) units->unit_gate()->settle();
}

}  // namespace train
