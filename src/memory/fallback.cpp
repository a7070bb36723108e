#include "memory/fallback.h"

#include <fmt/format.h>

#include <algorithm>

namespace memory {

Rung parse_rung(const std::string& name) {
  if (name == "checkpoint_activations") return Rung::kCheckpointActivations;
  if (name == "halve_micro_batch") return Rung::kHalveMicroBatch;
  if (name == "uncache_embeddings") return Rung::kUncacheEmbeddings;
  throw std::invalid_argument(fmt::format(
      "memory.fallback: unknown rung '{}'; rungs are checkpoint_activations, halve_micro_batch, "
      "uncache_embeddings", name));
}

std::string to_string(Rung rung) {
  switch (rung) {
    case Rung::kCheckpointActivations: return "checkpoint_activations";
    case Rung::kHalveMicroBatch: return "halve_micro_batch";
    case Rung::kUncacheEmbeddings: return "uncache_embeddings";
  }
  return "?";
}

FallbackLadder::FallbackLadder(std::vector<Rung> rungs, int64_t micro_batch,
                               int64_t min_micro_batch, bool has_cache, bool can_checkpoint)
    : rungs_(std::move(rungs)), micro_batch_(micro_batch),
      min_micro_batch_(std::max<int64_t>(1, min_micro_batch)), has_cache_(has_cache),
      can_checkpoint_(can_checkpoint) {}

std::optional<FallbackAction> FallbackLadder::next() {
  while (position_ < rungs_.size()) {
    const Rung rung = rungs_[position_];
    if (rung == Rung::kHalveMicroBatch) {
      if (micro_batch_ > min_micro_batch_) {
        const int64_t old = micro_batch_;
        micro_batch_ = std::max(min_micro_batch_, micro_batch_ / 2);
        return FallbackAction{rung, old, micro_batch_};
      }
    } else if (rung == Rung::kUncacheEmbeddings && has_cache_) {
      has_cache_ = false;
      ++position_;
      return FallbackAction{rung, micro_batch_, micro_batch_};
    } else if (rung == Rung::kCheckpointActivations && can_checkpoint_) {
      can_checkpoint_ = false;
      ++position_;
      return FallbackAction{rung, micro_batch_, micro_batch_};
    }
    ++position_;  // this rung can do no more
  }
  return std::nullopt;
}

}  // namespace memory
