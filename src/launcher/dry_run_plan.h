// --dry-run --plan-ranks N --plan-device-memory SIZE: a CUDA job planned where it is not run (a
// login node without a GPU). The model is built on the CPU of this one process; its bucket layout
// gives each ddp.shard mode's per-rank state at N ranks (ddp::shard_footprint, every mode of
// ddp::kShardModeNames), and its activation probe, run on the CPU at the config's precision, stands
// in for the device's (docs/DESIGN.md, "Planning without the device"). The
// CUDA memory the probe cannot see is a fixed reserve of named parts (kCudaReserves). Pure
// arithmetic except print_device_plan: the unit tests check it in closed form.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/batch_plan.h"
#include "ddp/buckets.h"
#include "ddp/shard.h"
#include "launcher/startup.h"
#include "memory/estimator.h"

namespace launcher {

// A device size: bytes ("1000") or a number with a unit, decimal (KB, MB, GB, TB) or binary
// (KiB, MiB, GiB, TiB). Throws std::invalid_argument naming `flag` and the text otherwise.
int64_t parse_device_memory(const std::string& text, std::string_view flag);

// CUDA memory outside the tensors a CPU probe measures, reserved from the stated device memory.
struct CudaReserve {
  const char* name;
  int64_t bytes;
};
inline constexpr CudaReserve kCudaReserves[] = {
    {"CUDA context", int64_t{512} << 20},            // driver, kernels of LibTorch's modules
    {"cuBLAS/cuDNN workspaces", int64_t{64} << 20},  // per handle and stream
    {"NCCL buffers", int64_t{256} << 20},            // channels x peers x NCCL_BUFFSIZE
};
int64_t cuda_reserve_bytes();

// One ddp.shard mode at the planned world size.
struct ModePlan {
  ddp::ShardMode mode{};
  ddp::ShardFootprint state;
  int64_t micro_auto = 0;        // the micro-batch `auto` would pick; 0 when not even 1 fits
  bool configured_fits = false;  // the configured micro-batch (or auto's pick) fits the budget
};

struct DevicePlan {
  int ranks = 0;
  int64_t device_bytes = 0;
  int64_t budget = 0;         // target_fraction x device_bytes, less the reserves
  ddp::ShardMode in_force{};  // ddp.shard of the config
  ddp::BatchPlan batch;  // rank 0's split of the global batch (configured micro-batch or auto's)
  memory::MemoryEstimate activations;  // the probe's activation terms (CPU-measured)
  std::vector<ModePlan> modes;         // every ddp.shard mode, in enum order
};

// `probe` holds the CPU probe's activation terms; `micro_batch` is train.micro_batch_size (<= 0:
// auto: the batch split then takes auto's pick under `in_force`, the mode in force). Throws
// ddp::PlanError when the global batch is smaller than `ranks`.
DevicePlan plan_device(const std::vector<ddp::BucketLayout>& layout, c10::ScalarType reduce_dtype,
                       const memory::MemoryEstimate& probe, int64_t global_batch,
                       int64_t micro_batch, int ranks, int64_t device_bytes, double target_fraction,
                       ddp::ShardMode in_force);

// The plan as lines for the log: the table of modes, activations, the batch split, the verdict
// for `in_force`.
std::vector<std::string> describe_device_plan(const DevicePlan& plan, int64_t micro_batch);

// Rank 0 of a one-process --dry-run logs the plan of its config for `ranks` devices of
// `device_bytes` each. Throws ddp::PlanError (a global batch smaller than `ranks`).
void log_device_plan(const Startup& s, int ranks, int64_t device_bytes);

}  // namespace launcher
