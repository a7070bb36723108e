#include "train/fallbacks.h"

#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/error_text.h"
#include "memory/memory_stats.h"
#include "models/capabilities.h"

namespace train {
namespace {

// Parameters, gradients and optimizer state this rank keeps between steps, as planned.
int64_t kept_bytes(const memory::MemoryEstimate& e) {
  return e.parameters + e.gradients + e.optimizer_state;
}

}  // namespace

FallbacksSpent::FallbacksSpent(int64_t step, std::string head, std::string advice)
    : memory::OutOfMemoryFatal(fmt::format(
          "{}\n{}. {}", head, "no checkpoint written (checkpoint.dir is not set)", advice)),
      step_(step), head_(std::move(head)), advice_(std::move(advice)) {}

std::string FallbacksSpent::with_checkpoint(const std::string& where) const {
  return fmt::format("{}\n{}. {}", head_, where, advice_);
}

Fallbacks::Fallbacks(const memory::MemoryOptions& options, RungTargets targets)
    : options_(options), t_(targets),
      ladder_(options.fallback, targets.batches.micro_batch(), options.min_micro_batch, effects()) {
}

memory::RungEffects Fallbacks::effects() {
  memory::RungEffects effects;
  effects.halve_micro_batch = [this](int64_t old_micro, int64_t new_micro) {
    return halve_micro_batch(old_micro, new_micro);
  };
  // A model that can checkpoint activations (and does not already) offers that rung.
  auto* checkpointing = models::as<models::ActivationCheckpointing>(t_.model);
  if (checkpointing != nullptr && !models::checkpoints_activations(t_.model)) {
    effects.checkpoint_activations = [this, checkpointing] {
      checkpointing->set_checkpoint_activations(true);
      return fmt::format("each block is now recomputed in backward instead of keeping its "
                         "activations; micro-batch {} unchanged",
                         t_.batches.plan().micro_batch);
    };
  }
  if (models::has_cache(t_.model)) {
    effects.uncache_embeddings = [this] {
      models::as<models::EmbeddingCache>(t_.model)->uncache();
      return std::string("embedding caches released, embeddings now computed per micro-batch");
    };
  }
  const int world = t_.placement.world();
  if (!t_.state.reducer().sharded() && world > 1) {
    effects.shard_optimizer = [this] { return shard_optimizer(); };
  }
  if (t_.state.shard_mode() != ddp::ShardMode::kParameters && world > 1) {
    effects.shard_parameters = [this] { return shard_parameters(); };
  }
  return effects;
}

void Fallbacks::fall_back(int64_t step, const std::string& my_failure, GraphStep& graphs) {
  const std::vector<std::string> failures = gather_failures(t_.placement.control, my_failure);
  memory::FallbackRung* rung = ladder_.next();
  if (rung == nullptr) throw spent(step, failures);
  ++taken_;
  // A captured graph holds the old micro-batch's shapes (and the model as it was): capture anew.
  graphs.invalidate(fmt::format("fallback {}", rung->name()));
  const std::string change = rung->take();
  if (t_.placement.rank() == 0)
    spdlog::warn("{}", memory::taken_message(step, failures, *rung, change));
}

std::string Fallbacks::halve_micro_batch(int64_t old_micro_batch, int64_t new_micro_batch) {
  const int64_t old_accumulation = t_.batches.plan().accumulation();
  t_.batches.set_micro_batch(new_micro_batch, t_.state.shard_mode() == ddp::ShardMode::kParameters);
  const ddp::BatchPlan& plan = t_.batches.plan();
  return fmt::format("micro-batch {} -> {}, accumulation {} -> {} (rank 0); global batch {} "
                     "unchanged",
                     old_micro_batch, plan.micro_batch, old_accumulation, plan.accumulation(),
                     plan.global_batch);
}

void Fallbacks::switch_or_abort(ddp::ShardMode mode, const char* rung,
                                const std::function<void()>& reshard) {
  try {
    reshard();
  } catch (const c10::OutOfMemoryError& err) {
    // After the vote: the other ranks are switching too, and this rank cannot follow.
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory switching to ddp.shard: {} (memory.fallback rung {}): {}",
        t_.placement.rank(), ddp::to_string(mode), rung,
        core::first_line(err.what_without_backtrace())));
  }
}

std::string Fallbacks::shard_optimizer() {
  memory::MemoryEstimate& e = t_.memory.estimate();
  const int64_t before = e.gradients + e.optimizer_state;
  switch_or_abort(ddp::ShardMode::kOptimizer, "shard_optimizer",
                  [this] { t_.state.shard_optimizer_in_place(); });
  e.gradients = t_.state.reducer().gradient_bytes();
  e.optimizer_state = t_.state.optimizer_bytes();
  return fmt::format("now ddp.shard: optimizer, each rank keeps the AdamW moments of its 1/{} of "
                     "the parameters (gradients and optimizer state {} -> {} per rank); "
                     "micro-batch {} unchanged",
                     t_.placement.world(), memory::mib_text(before),
                     memory::mib_text(e.gradients + e.optimizer_state),
                     t_.batches.plan().micro_batch);
}

std::string Fallbacks::shard_parameters() {
  const ddp::ShardMode before = t_.state.shard_mode();
  memory::MemoryEstimate& e = t_.memory.estimate();
  const int64_t bytes = kept_bytes(e);
  switch_or_abort(ddp::ShardMode::kParameters, "shard_parameters",
                  [this] { t_.state.shard_parameters_in_place(); });
  // The same number of micro-batches on every rank.
  t_.batches.set_micro_batch(t_.batches.micro_batch(), /*equal_counts=*/true);
  t_.memory.count_parameter_shards(t_.model, t_.state.reducer());
  e.gradients = t_.state.reducer().gradient_bytes();
  e.optimizer_state = t_.state.optimizer_bytes();
  return fmt::format(
      "now ddp.shard: parameters (was {}), each rank keeps its 1/{} of the parameters, gradients "
      "and AdamW moments and gathers the model unit by unit (parameters, gradients and optimizer "
      "state {} -> {} per rank); micro-batch {} unchanged",
      ddp::to_string(before), t_.placement.world(), memory::mib_text(bytes),
      memory::mib_text(kept_bytes(e)), t_.batches.plan().micro_batch);
}

FallbacksSpent Fallbacks::spent(int64_t step, const std::vector<std::string>& failures) const {
  const int64_t micro_batch = t_.batches.micro_batch();
  // Accumulation keeps the global batch whatever the micro-batch: only a smaller micro-batch,
  // model or footprint helps, never a smaller global batch.
  std::string advice =
      micro_batch > 1
          ? fmt::format("Let the micro-batch shrink further (memory.min_micro_batch = {}, "
                        "memory.fallback), use a smaller model, or give each rank more memory.",
                        options_.min_micro_batch)
          : "Even one sample per micro-batch does not fit: use a smaller model or give each rank "
            "more memory.";
  // Sharding the optimizer state frees 2P(1 - 1/W) per rank for activations.
  if (t_.state.shard_mode() == ddp::ShardMode::kNone && t_.placement.world() > 1) {
    advice += " Or shard the optimizer state: ddp.shard: optimizer, or the rung shard_optimizer "
              "in memory.fallback.";
  }
  return FallbacksSpent(
      step,
      fmt::format("out of memory at step {} with every fallback spent (memory.fallback = [{}], "
                  "micro-batch {}):\n  {}",
                  step, fmt::join(memory::to_strings(options_.fallback), ", "), micro_batch,
                  fmt::join(failures, "\n  ")),
      advice);
}

}  // namespace train
