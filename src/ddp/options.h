// Options of the ddp section of the config (declared with defaults in config/schema_ddp.cpp;
// the initialisers here are only zero values). Choice keys are enums, with their names indexed by
// the enum's value.
#pragma once

#include <array>
#include <string>

namespace ddp {

// ddp.reduce_dtype: the dtype of the gradient all-reduce.
enum class ReduceDtype { kFp32, kBf16 };
inline constexpr std::array<const char*, 2> kReduceDtypeNames = {"fp32", "bf16"};

// ddp.shard: what a rank keeps of the optimizer state, gradients and parameters (ddp/shard.h,
// ZeRO-1/2/3). Ordered by how much is sharded.
enum class ShardMode { kNone, kOptimizer, kGradients, kParameters };
inline constexpr std::array<const char*, 4> kShardModeNames = {"none", "optimizer", "gradients",
                                                               "parameters"};

// ddp.shard_group: the ranks a shard spans. node: shard within each node and replicate the
// shards across nodes (hybrid sharding; MpiRuntime::node / cross_node).
enum class ShardGroup { kWorld, kNode };
inline constexpr std::array<const char*, 2> kShardGroupNames = {"world", "node"};

// ddp.mpi_progress: what moves posted MPI operations forward (ddp/mpi_progress.h).
enum class MpiProgressMode { kAuto, kThread, kCaller };
inline constexpr std::array<const char*, 3> kMpiProgressModeNames = {"auto", "thread", "caller"};

// ddp.mpi_progress: auto is the progress thread where a step waits on many posted operations
// (ddp.shard: parameters gathers each unit ahead while the one before computes: without the
// thread a posted gather moves only inside the next MPI call) and the caller otherwise.
inline bool mpi_progress_thread(MpiProgressMode mode, ShardMode shard, int world_size) {
  if (mode != MpiProgressMode::kAuto) return mode == MpiProgressMode::kThread;
  return shard == ShardMode::kParameters && world_size > 1;
}

struct DdpOptions {
  std::string backend;         // auto | nccl | mpi
  double timeout_s = 0;        // deadline of every collective
  double first_bucket_mb = 0;  // cap of the first gradient bucket
  double bucket_mb = 0;        // cap of the other buckets
  bool find_unused_parameters = false;
  ReduceDtype reduce_dtype{};          // fp32 | bf16: dtype of the gradient all-reduce
  ShardMode shard{};                   // none | optimizer | gradients | parameters (ddp/shard.h)
  ShardGroup shard_group{};            // world | node: the ranks a shard spans
  bool reshard_after_forward = false;  // parameters: free each unit after its forward
  bool prefetch_units = false;         // parameters: gather the next unit while one computes
  MpiProgressMode mpi_progress{};      // auto | thread | caller (ddp/mpi_progress.h)
  double mpi_poll_us = 0;              // the progress thread's pause between rounds of MPI_Test
};

}  // namespace ddp
