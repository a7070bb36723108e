#include "memory/fallback.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace memory {

Rung parse_rung(const std::string& name) {
  for (size_t i = 0; i < kRungNames.size(); ++i) {
    if (name == kRungNames[i]) return static_cast<Rung>(i);
  }
  throw std::invalid_argument(fmt::format("memory.fallback: unknown rung '{}'; rungs are {}", name,
                                          fmt::join(kRungNames, ", ")));
}

std::string to_string(Rung rung) { return kRungNames.at(static_cast<size_t>(rung)); }

std::vector<std::string> to_strings(const std::vector<Rung>& rungs) {
  std::vector<std::string> names;
  for (const Rung rung : rungs) names.push_back(to_string(rung));
  return names;
}

HalveMicroBatch::HalveMicroBatch(int64_t micro_batch, int64_t min_micro_batch, Apply apply)
    : FallbackRung(Rung::kHalveMicroBatch), micro_batch_(micro_batch),
      min_micro_batch_(std::max<int64_t>(1, min_micro_batch)), apply_(std::move(apply)) {}

std::string HalveMicroBatch::take() {
  const int64_t old = micro_batch_;
  micro_batch_ = std::max(min_micro_batch_, micro_batch_ / 2);
  return apply_ ? apply_(old, micro_batch_)
                : fmt::format("micro-batch {} -> {}", old, micro_batch_);
}

OnceRung::OnceRung(Rung kind, std::function<std::string()> apply)
    : FallbackRung(kind), apply_(std::move(apply)) {}

std::string OnceRung::take() {
  taken_ = true;
  return apply_();
}

FallbackLadder::FallbackLadder(const std::vector<Rung>& order, int64_t micro_batch,
                               int64_t min_micro_batch, RungEffects effects) {
  const auto rung_of = [&](Rung kind) -> FallbackRung* {
    for (const auto& rung : rungs_) {
      if (rung->kind() == kind) return rung.get();
    }
    switch (kind) {
      case Rung::kHalveMicroBatch:
        rungs_.push_back(std::make_unique<HalveMicroBatch>(micro_batch, min_micro_batch,
                                                           std::move(effects.halve_micro_batch)));
        break;
      case Rung::kCheckpointActivations:
        rungs_.push_back(
            std::make_unique<OnceRung>(kind, std::move(effects.checkpoint_activations)));
        break;
      case Rung::kUncacheEmbeddings:
        rungs_.push_back(std::make_unique<OnceRung>(kind, std::move(effects.uncache_embeddings)));
        break;
      case Rung::kShardOptimizer:
        rungs_.push_back(std::make_unique<OnceRung>(kind, std::move(effects.shard_optimizer)));
        break;
      case Rung::kShardParameters:
        rungs_.push_back(std::make_unique<OnceRung>(kind, std::move(effects.shard_parameters)));
        break;
    }
    return rungs_.back().get();
  };
  for (const Rung kind : order) order_.push_back(rung_of(kind));
}

FallbackRung* FallbackLadder::next() {
  while (position_ < order_.size()) {
    FallbackRung* rung = order_[position_];
    if (rung->can_help()) {
      if (!rung->repeats()) ++position_;
      return rung;
    }
    ++position_;  // this rung can do no more
  }
  return nullptr;
}

std::string taken_message(int64_t step, const std::vector<std::string>& failures,
                          const FallbackRung& rung, const std::string& change) {
  return fmt::format(
      "step {}: out of memory on {} rank(s): {}. Fallback {}: {}; retrying the step.", step,
      failures.size(), fmt::join(failures, "; "), rung.name(), change);
}

}  // namespace memory
