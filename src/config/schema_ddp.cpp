// The ddp section's keys (ddp::DdpOptions), each declared once with its default.

#include "config/key_builders.h"
#include "ddp/options.h"

namespace config::schema {

std::vector<KeyDef> ddp_keys() {
  return {
      choice("ddp.backend", FIELD(ddp.backend), "auto", {"auto", "nccl", "mpi"},
             "auto: NCCL for CUDA tensors, MPI for CPU"),
      real("ddp.timeout_s", FIELD(ddp.timeout_s), "600", 0.0, 7 * 86400.0, true, false,
           "deadline of every collective; past it the job ends instead of hanging"),
      real("ddp.first_bucket_mb", FIELD(ddp.first_bucket_mb), "1", 0.0, 65536.0, true, false,
           "cap of the first gradient bucket (MiB): small, so communication starts early"),
      real("ddp.bucket_mb", FIELD(ddp.bucket_mb), "25", 0.0, 65536.0, true, false,
           "cap of the other gradient buckets (MiB)"),
      boolean("ddp.find_unused_parameters", FIELD(ddp.find_unused_parameters), "false",
              "reduce parameters that got no gradient as zeros instead of stopping with an error"),
      enum_choice("ddp.reduce_dtype", FIELD(ddp.reduce_dtype), "fp32", ddp::kReduceDtypeNames,
                  "dtype the gradient buckets are all-reduced in: bf16 halves the bytes on the "
                  "wire (gradients, parameters and AdamW stay fp32; each bucket is cast for the "
                  "reduction and back)"),
      enum_choice("ddp.shard", FIELD(ddp.shard), "none", ddp::kShardModeNames,
                  "ZeRO sharding: optimizer keeps each rank's 1/N of the AdamW state (gradients "
                  "reduce-scattered, parameters all-gathered); gradients also keeps only 1/N of "
                  "the reduced gradients between steps; parameters (ZeRO-3) also keeps only 1/N "
                  "of the parameters and gathers the model unit by unit (a transformer block, the "
                  "embeddings, the output layer) for forward and backward"),
      enum_choice("ddp.shard_group", FIELD(ddp.shard_group), "world", ddp::kShardGroupNames,
                  "the ranks ddp.shard shards over: world (every rank keeps 1/N of the world) or "
                  "node (hybrid sharding: every rank keeps 1/N of its node's ranks; gradients are "
                  "reduce-scattered within the node, then the shards all-reduced across nodes; "
                  "needs ddp.shard other than none and every node running the same number of "
                  "ranks)"),
      boolean("ddp.reshard_after_forward", FIELD(ddp.reshard_after_forward), "true",
              "ddp.shard: parameters: free each unit's gathered parameters after its forward and "
              "gather it again for backward (false: keep every unit gathered until its backward)"),
      boolean("ddp.prefetch_units", FIELD(ddp.prefetch_units), "true",
              "ddp.shard: parameters: all-gather the next unit while the current one computes, in "
              "forward and in backward (false: gather each unit when it is reached)"),
      enum_choice("ddp.mpi_progress", FIELD(ddp.mpi_progress), "auto", ddp::kMpiProgressModeNames,
                  "what moves the MPI data plane's posted operations (gradient buckets on CPU) "
                  "forward while backward computes: thread (a progress thread tests them; "
                  "MPI_THREAD_MULTIPLE), caller (only the training thread's own MPI calls, as "
                  "Open MPI does by itself), or auto (thread under ddp.shard: parameters at more "
                  "than one rank, whose prefetched gathers need it; caller otherwise)"),
      real("ddp.mpi_poll_us", FIELD(ddp.mpi_poll_us), "50", 1.0, 1e6, false, false,
           "ddp.mpi_progress: thread: microseconds between the progress thread's rounds of "
           "MPI_Test while the training thread computes")};
}

}  // namespace config::schema
