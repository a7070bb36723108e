// Fallbacks: what every rank does after a step's status vote counted an out-of-memory failure
// (docs/DESIGN.md, "The OOM protocol"): the next rung of memory.fallback (memory/fallback.h),
// taken by every rank together, and the same step again; past the last rung, FallbacksSpent on
// every rank. The rungs' effects act on the Trainer's parts (RungTargets): the micro-batch
// (halve_micro_batch), the model (checkpoint_activations, uncache_embeddings), and the model's
// state, sharded in place (shard_optimizer, shard_parameters: train/model_state.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memory/fallback.h"
#include "memory/oom.h"
#include "memory/options.h"
#include "models/model.h"
#include "train/batches.h"
#include "train/graph_step.h"
#include "train/memory_planner.h"
#include "train/model_state.h"
#include "train/placement.h"

namespace train {

// Every rung spent: every rank throws it after the same vote. The loop writes the state of the
// steps before (the out-of-memory checkpoint) and ends the run with with_checkpoint()'s message
// (exit 4).
class FallbacksSpent : public memory::OutOfMemoryFatal {
 public:
  // `head`: what ran out and which rungs were spent; `advice`: what the user can do.
  FallbacksSpent(int64_t step, std::string head, std::string advice);
  int64_t step() const { return step_; }
  // The message with where the state was written ("checkpoint written to PATH", or why none).
  std::string with_checkpoint(const std::string& where) const;

 private:
  int64_t step_;
  std::string head_;
  std::string advice_;
};

// The Trainer's parts a rung changes (borrowed; they outlive the Fallbacks).
struct RungTargets {
  models::Model& model;
  Batches& batches;
  ModelState& state;
  MemoryPlanner& memory;
  const Placement& placement;
};

class Fallbacks {
 public:
  // The ladder starts from the job-wide micro-batch in force.
  Fallbacks(const memory::MemoryOptions& options, RungTargets targets);

  // After a failed vote: every rank's failure gathered, then the next rung on every rank (rank 0
  // logs which and what changed; a captured CUDA graph is dropped), or FallbacksSpent. Collective.
  void fall_back(int64_t step, const std::string& my_failure, GraphStep& graphs);
  // Rungs taken so far.
  int taken() const { return taken_; }

 private:
  memory::RungEffects effects();
  // The rungs' effects; each returns what changed, for the "taken" line.
  std::string halve_micro_batch(int64_t old_micro_batch, int64_t new_micro_batch);
  std::string shard_optimizer();
  std::string shard_parameters();
  FallbacksSpent spent(int64_t step, const std::vector<std::string>& failures) const;
  // Runs `reshard` (the rung `rung`, switching to `mode`); out of memory there, after the vote,
  // is memory::OutOfMemoryAbort on this rank.
  void switch_or_abort(ddp::ShardMode mode, const char* rung, const std::function<void()>& reshard);

  const memory::MemoryOptions& options_;
  RungTargets t_;
  memory::FallbackLadder ladder_;
  int taken_ = 0;
};

}  // namespace train
