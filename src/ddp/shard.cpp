#include "ddp/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace ddp {

std::string_view to_string(ShardMode mode) { return kShardModeNames.at(static_cast<size_t>(mode)); }

std::pair<int64_t, int64_t> BucketShard::owned(int64_t offset, int64_t count) const {
  const int64_t first = std::max(offset, begin);
  const int64_t last = std::min(offset + count, end());
  return first < last ? std::make_pair(first, last) : std::make_pair(first, first);
}

BucketShard shard_bucket(int64_t numel, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world || numel < 0) {
    throw std::invalid_argument(
        fmt::format("shard_bucket: rank {} of {} ranks, {} elements", rank, world, numel));
  }
  BucketShard s;
  s.numel = numel;
  s.padded = (numel + world - 1) / world * world;
  s.size = s.padded / world;
  s.begin = rank * s.size;
  return s;
}

ShardFootprint shard_footprint(const std::vector<BucketLayout>& layout, int world, ShardMode mode,
                               c10::ScalarType reduce_dtype) {
  ShardFootprint f;
  int64_t largest_unit = 0;
  for (const auto& bucket : layout) {
    const auto elem = static_cast<int64_t>(c10::elementSize(bucket.dtype));
    const bool wire = reduce_dtype != c10::ScalarType::Undefined && reduce_dtype != bucket.dtype &&
                      world > 1 && c10::isFloatingType(bucket.dtype);
    const int64_t wire_elem = wire ? static_cast<int64_t>(c10::elementSize(reduce_dtype)) : 0;
    const BucketShard s = shard_bucket(bucket.numel, world, 0);
    switch (mode) {
      case ShardMode::kNone:
        f.parameters += bucket.numel * elem;
        f.gradients += bucket.numel * (elem + wire_elem);
        f.optimizer_state += 2 * bucket.numel * elem;
        break;
      case ShardMode::kOptimizer:  // the full buckets stay; the blocks are extra (one rank: the
                                   // same)
        f.parameters += s.padded * elem;
        f.gradients +=
            s.padded * (elem + wire_elem) + (world > 1 ? s.size * (elem + wire_elem) : 0);
        f.optimizer_state += 2 * s.size * elem;
        break;
      case ShardMode::kGradients:  // the blocks only
        f.parameters += s.padded * elem;
        f.gradients += s.size * (elem + wire_elem);
        f.optimizer_state += 2 * s.size * elem;
        break;
      case ShardMode::kParameters:  // the blocks of everything; the units gathered in flight
        f.parameters += s.size * elem;
        f.gradients += s.size * (elem + wire_elem);
        f.optimizer_state += 2 * s.size * elem;
        largest_unit = std::max(largest_unit, s.padded * elem);
        break;
    }
  }
  // At most two units are gathered at a time (one computing, the next prefetched).
  if (mode == ShardMode::kParameters) f.parameters += 2 * largest_unit;
  return f;
}

}  // namespace ddp
