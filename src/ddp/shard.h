// Sharding (ZeRO): how a flat gradient bucket is split among the ranks, and the ddp.shard modes.
//
// A bucket of n elements is padded with zeros to the next multiple of the world size W, so that
// every rank owns one contiguous block of the same length: rank r owns [r * S, (r + 1) * S) of
// the padded bucket, S = padded / W. Any n and any W work (a bucket smaller than W gives most
// ranks a block of padding only); padding is never more than W - 1 elements per bucket. These are
// pure functions of (n, W, r): every rank computes the same geometry.
//
// Modes (ddp.shard):
// - kNone: every rank keeps the full gradients and optimizer state (all-reduce).
// - kOptimizer (ZeRO-1): gradients are reduce-scattered; a rank keeps the AdamW moments of its
//   blocks only, updates its blocks of the parameters, and all-gathers the parameters.
// - kGradients (ZeRO-2): as kOptimizer, and only the reduced blocks of the gradients persist; the
//   full buckets exist while gradients accumulate and are in flight (ddp/reducer.h).
// - kParameters (ZeRO-3): as kGradients, and a rank keeps only its blocks of the parameters; the
//   buckets are the model's units, each gathered whole only while it computes (ddp/reducer.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/buckets.h"
#include "ddp/options.h"

namespace ddp {

// ShardMode (ddp.shard) is declared with the ddp options, where the config loader parses it.
std::string_view to_string(ShardMode mode);

struct BucketShard {
  int64_t numel = 0;   // the bucket's own elements
  int64_t padded = 0;  // numel rounded up to a multiple of the world size
  int64_t size = 0;    // elements per rank: padded / world
  int64_t begin = 0;   // this rank's first element: rank * size

  int64_t end() const { return begin + size; }
  // The elements of [offset, offset + count) (a parameter in the bucket) that this rank owns, as
  // [first, last); empty (first == last) when it owns none of them.
  std::pair<int64_t, int64_t> owned(int64_t offset, int64_t count) const;
};

BucketShard shard_bucket(int64_t numel, int world, int rank);

// What one rank keeps between steps under a ddp.shard mode, for the buckets `layout` on `world`
// ranks (every rank's block has the same length): the gradient buffers as the Reducer keeps them
// (full buckets, reduced blocks, reduce_dtype copies: Reducer::gradient_bytes()), AdamW's two
// moments in each parameter's dtype (FusedAdamW::state_bytes()), and the parameters (padded flat
// buffers when sharded; under kParameters the blocks plus two gathered units, the largest of
// `layout`, which then holds one bucket per unit). Pure arithmetic: the memory plan and --dry-run
// compare the modes with it.
struct ShardFootprint {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t total() const { return parameters + gradients + optimizer_state; }
};
ShardFootprint shard_footprint(const std::vector<BucketLayout>& layout, int world, ShardMode mode,
                               c10::ScalarType reduce_dtype = c10::ScalarType::Undefined);

}  // namespace ddp
