// The rungs of memory.fallback and the ladder that takes them: what the job does next when a step
// ran out of memory (docs/DESIGN.md, "The OOM protocol").
//
// Each rung is one object: whether it can still free memory, and taking it (an effect the caller
// gives, since what it changes lives above this layer: the batch plan, the model, the optimizer),
// which says what changed. Rungs are taken in the configured order; halve_micro_batch is taken
// again and again until the micro-batch reaches the floor, the others once. Every rank holds an
// identical ladder and advances it only after the status vote, so all ranks take the same rung
// together; each says so in one format (taken_message).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/options.h"

namespace memory {

// Throws std::invalid_argument naming memory.fallback for an unknown rung name.
Rung parse_rung(const std::string& name);
std::string to_string(Rung rung);
std::vector<std::string> to_strings(const std::vector<Rung>& rungs);

class FallbackRung {
 public:
  explicit FallbackRung(Rung kind) : kind_(kind) {}
  virtual ~FallbackRung() = default;
  FallbackRung(const FallbackRung&) = delete;
  FallbackRung& operator=(const FallbackRung&) = delete;

  Rung kind() const { return kind_; }
  std::string name() const { return to_string(kind_); }
  // Whether taking the rung now could free memory (false: the ladder passes over it).
  virtual bool can_help() const = 0;
  // Applies the rung on this rank (local; every rank takes it after the same vote) and says what
  // changed, for taken_message: "micro-batch 8 -> 4, ...".
  virtual std::string take() = 0;
  // Whether the ladder stays on this rung after taking it (halve_micro_batch, until the floor).
  virtual bool repeats() const { return false; }

 private:
  Rung kind_;
};

// halve_micro_batch: the micro-batch n becomes max(floor, n / 2), while n is above the floor
// (memory.min_micro_batch, at least 1).
class HalveMicroBatch final : public FallbackRung {
 public:
  // Makes `new_micro_batch` the micro-batch in force; returns what changed.
  using Apply = std::function<std::string(int64_t old_micro_batch, int64_t new_micro_batch)>;
  HalveMicroBatch(int64_t micro_batch, int64_t min_micro_batch, Apply apply);
  bool can_help() const override { return micro_batch_ > min_micro_batch_; }
  std::string take() override;
  bool repeats() const override { return true; }
  int64_t micro_batch() const { return micro_batch_; }

 private:
  int64_t micro_batch_;
  int64_t min_micro_batch_;
  Apply apply_;
};

// A rung taken at most once: checkpoint_activations, uncache_embeddings, shard_optimizer,
// shard_parameters.
class OnceRung final : public FallbackRung {
 public:
  // `apply`: the rung's effect, returning what changed; empty where this run cannot take it (a
  // model without caches or activation checkpointing, a run already sharded or on one rank).
  OnceRung(Rung kind, std::function<std::string()> apply);
  bool can_help() const override { return !taken_ && apply_; }
  std::string take() override;

 private:
  std::function<std::string()> apply_;
  bool taken_ = false;
};

// What each rung does in this run (the rungs' `apply`); an empty effect: the run offers no such
// rung, and the ladder passes over it.
struct RungEffects {
  HalveMicroBatch::Apply halve_micro_batch;
  std::function<std::string()> checkpoint_activations;
  std::function<std::string()> uncache_embeddings;
  std::function<std::string()> shard_optimizer;
  std::function<std::string()> shard_parameters;
};

class FallbackLadder {
 public:
  FallbackLadder() = default;
  // The rungs of `order` (memory.fallback), one object per kind, a kind listed twice being the
  // same rung. `micro_batch`: the job-wide micro-batch in force (the same on every rank).
  FallbackLadder(const std::vector<Rung>& order, int64_t micro_batch, int64_t min_micro_batch,
                 RungEffects effects);

  // The next rung that can help, for the caller to take() right away (every rank the same one),
  // or nullptr when every rung is spent. Rungs that cannot help are passed over for good.
  FallbackRung* next();

 private:
  std::vector<std::unique_ptr<FallbackRung>> rungs_;  // one per kind
  std::vector<FallbackRung*> order_;                  // memory.fallback's order
  size_t position_ = 0;
};

// The line every taken rung is announced with (rank 0 logs it):
//   "step S: out of memory on N rank(s): FAILURES. Fallback RUNG: CHANGE; retrying the step."
std::string taken_message(int64_t step, const std::vector<std::string>& failures,
                          const FallbackRung& rung, const std::string& change);

}  // namespace memory
