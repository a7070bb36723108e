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

}  // namespace ddp
