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

FallbackLadder::FallbackLadder(std::vector<Rung> rungs, int64_t micro_batch,
                               int64_t min_micro_batch, bool has_cache, bool can_checkpoint,
                               bool can_shard)
    : rungs_(std::move(rungs)), micro_batch_(micro_batch),
      min_micro_batch_(std::max<int64_t>(1, min_micro_batch)), has_cache_(has_cache),
      can_checkpoint_(can_checkpoint), can_shard_(can_shard) {}

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
    } else if (rung == Rung::kShardOptimizer && can_shard_) {
      can_shard_ = false;
      ++position_;
      return FallbackAction{rung, micro_batch_, micro_batch_};
    }
    ++position_;  // this rung can do no more
  }
  return std::nullopt;
}

}  // namespace memory
