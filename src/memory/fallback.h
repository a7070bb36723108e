// FallbackLadder: what the job does next when a step ran out of memory (docs/DESIGN.md, "The
// OOM protocol"). Rungs are taken in order; halve_micro_batch is taken repeatedly until the
// micro-batch reaches the floor, then the ladder moves on. Every rank holds an identical ladder
// and advances it only after the status vote, so all ranks apply the same rung together.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/options.h"

namespace memory {

// Throws std::invalid_argument naming memory.fallback for an unknown rung name.
Rung parse_rung(const std::string& name);
std::string to_string(Rung rung);
std::vector<std::string> to_strings(const std::vector<Rung>& rungs);

struct FallbackAction {
  Rung rung;
  int64_t old_micro_batch = 0;
  int64_t new_micro_batch = 0;  // equal to old for rungs that keep the micro-batch
};

class FallbackLadder {
 public:
  // `micro_batch`: the job-wide micro-batch in force (the same number on every rank).
  // `has_cache`: whether the model has embedding caches to release.
  // `can_checkpoint`: whether the model can turn activation checkpointing on (and has not yet).
  // `can_shard`: whether the run keeps replicated optimizer state that sharding would shrink
  // (ddp.shard: none on more than one rank).
  FallbackLadder(std::vector<Rung> rungs, int64_t micro_batch, int64_t min_micro_batch,
                 bool has_cache, bool can_checkpoint = false, bool can_shard = false);

  // The next rung to apply, or nullopt when every rung is spent. Rungs that cannot help
  // (micro-batch at the floor, no cache, a model without activation checkpointing, a run already
  // sharded or on one rank) are passed over.
  std::optional<FallbackAction> next();

  int64_t micro_batch() const { return micro_batch_; }

 private:
  std::vector<Rung> rungs_;
  size_t position_ = 0;
  int64_t micro_batch_;
  int64_t min_micro_batch_;
  bool has_cache_;
  bool can_checkpoint_;
  bool can_shard_;
};

}  // namespace memory
