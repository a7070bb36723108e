// Options of the memory section of the config (declared with defaults in
// config/schema_memory.cpp; the initialisers here are only zero values).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace memory {

// A rung of memory.fallback (memory/fallback.h), with its names indexed by the enum's value.
enum class Rung {
  kCheckpointActivations,
  kHalveMicroBatch,
  kShardOptimizer,
  kUncacheEmbeddings,
  kShardParameters
};
inline constexpr std::array<const char*, 5> kRungNames = {"checkpoint_activations",
                                                          "halve_micro_batch", "shard_optimizer",
                                                          "uncache_embeddings", "shard_parameters"};

struct MemoryOptions {
  std::vector<Rung> fallback;   // rungs, in order
  int64_t min_micro_batch = 0;  // halve_micro_batch never goes below this (nor below 1)
  double fraction = 0;          // CUDA: cap of this process's share of the device (0: none)
  double cpu_budget_mb = 0;     // CPU: tensor memory budget per rank (0: none; -1: auto)
  std::string inject_oom;       // test hook: "rank:step:phase[:times]; ..."
  int64_t check_every = 0;      // memory table every N steps (0: at start and end only)
  double high_watermark = 0;    // warn above this share of a rank's device (or budget)
  double target_fraction = 0;   // micro_batch_size auto: plan to use this share of it
};

}  // namespace memory
