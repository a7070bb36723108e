// --dry-run --plan-ranks N --plan-device-memory SIZE: a CUDA job planned where it is not run (a
// login node without a GPU). The model is built on the CPU of this one process; its bucket layout
// gives each ddp.shard mode's per-rank state at N ranks (ddp::shard_footprint, every mode of
// ddp::kShardModeNames; under ddp.shard_group: node the shards span the M ranks of a node,
// --plan-ranks-per-node M, not the N), and its activation probe, run on the CPU at the config's
// precision, stands in for the device's (docs/DESIGN.md, "Planning without the device"). The CUDA
// memory the probe cannot see is a fixed reserve of named parts (kCudaReserves). Pure arithmetic
// except print_device_plan: the unit tests check it in closed form.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/batch_plan.h"
#include "ddp/buckets.h"
#include "ddp/shard.h"
#include "launcher/startup.h"
#include "memory/estimator.h"
#include "models/lm/lm_shape.h"

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

// The planned world: --plan-ranks, --plan-ranks-per-node and the config's ddp.shard_group.
struct PlannedWorld {
  int ranks = 0;
  int ranks_per_node = 0;  // 0: not stated
  ddp::ShardGroup shard_group = ddp::ShardGroup::kWorld;
};

// The ranks one shard spans in `world` (docs/reference.md, ddp.shard_group): all of them under
// ddp.shard_group: world, the ranks of one node under node. Throws ddp::PlanError naming
// --plan-ranks-per-node where it does not divide the ranks, or where node needs it and it is not
// stated.
int plan_shard_ranks(const PlannedWorld& world);

// One ddp.shard mode at the planned world size.
struct ModePlan {
  ddp::ShardMode mode{};
  ddp::ShardFootprint state;
  int64_t micro_auto = 0;        // the micro-batch `auto` would pick; 0 when not even 1 fits
  bool configured_fits = false;  // the configured micro-batch (or auto's pick) fits the budget
  int64_t least_peak = 0;        // the step's peak at micro-batch 1
};

// What fits where the configuration does not (docs/DESIGN.md, "Planning without the device"),
// under one ddp.shard mode: the levers the OOM fallback rungs pull in a run (memory/fallback.h),
// set in the config before it starts.
struct PlanFit {
  ddp::ShardMode mode{};
  int64_t micro_batch = 0;              // the largest that fits, up to the configured one; 0: none
  bool checkpoint_activations = false;  // model.checkpoint_activations turned on
  int64_t least_peak = 0;  // the peak at micro-batch 1 with the levers tried (every one: none fits)
};

struct DevicePlan {
  PlannedWorld world;
  // The ranks a shard spans (plan_shard_ranks): the sharded modes divide by it.
  int shard_ranks = 0;
  int64_t device_bytes = 0;
  int64_t budget = 0;         // target_fraction x device_bytes, less the reserves
  ddp::ShardMode in_force{};  // ddp.shard of the config
  ddp::BatchPlan batch;  // rank 0's split of the global batch (configured micro-batch or auto's)
  memory::MemoryEstimate activations;  // the activation terms: the CPU probe's, or computed
  bool activations_computed = false;   // computed from the shapes (plan_shape), not probed
  std::vector<ModePlan> modes;         // every ddp.shard mode, in enum order
  bool checkpointed = false;           // the activations are model.checkpoint_activations'
  std::vector<PlanFit> fits;  // what fits instead, per mode (find_fits); empty: not searched
};

// `probe` holds the CPU probe's activation terms; `micro_batch` is train.micro_batch_size (<= 0:
// auto: the batch split then takes auto's pick under `in_force`, the mode in force). Throws
// ddp::PlanError when the global batch is smaller than `world.ranks`, and as plan_shard_ranks.
// `frozen`: state outside the buckets, one layout per unit (a LoRA run's frozen base), counted
// with the parameters: whole on every rank, except under parameters, where each rank holds its
// blocks and two units in flight (ddp::ReducerOptions::frozen).
DevicePlan plan_device(const std::vector<ddp::BucketLayout>& layout, c10::ScalarType reduce_dtype,
                       const memory::MemoryEstimate& probe, int64_t global_batch,
                       int64_t micro_batch, const PlannedWorld& world, int64_t device_bytes,
                       double target_fraction, ddp::ShardMode in_force,
                       const std::vector<ddp::BucketLayout>& frozen = {});

// The plan of the same job with `in_force` as its ddp.shard and its activations with or without
// checkpointing (a probed plan, which measured one of them, ignores `checkpointed`).
using PlanOf = std::function<DevicePlan(ddp::ShardMode in_force, bool checkpointed)>;

// What fits under each ddp.shard mode, in enum order, with the fewest and cheapest levers: the
// configured micro-batch (auto: its pick), else a smaller one (the rung halve_micro_batch); then,
// where `can_checkpoint` and `checkpointed` is off, both again with activation checkpointing
// (checkpoint_activations). A mode other than the configured one is the rung shard_optimizer or
// shard_parameters (gradients has none). Each mode is planned in force (`plan_of`), as it would
// run. `micro_batch`: train.micro_batch_size (<= 0: auto).
std::vector<PlanFit> find_fits(const PlanOf& plan_of, int64_t micro_batch, bool checkpointed,
                               bool can_checkpoint);

// The plan as lines for the log: the table of modes, activations, the batch split, the verdict
// for `in_force`, and where it does not fit and `plan.fits` was searched, what fits instead (a line
// per mode that does, with the settings to add to the command line), or what the most needs.
std::vector<std::string> describe_device_plan(const DevicePlan& plan, int64_t micro_batch);

// Rank 0 of a one-process --dry-run logs the plan of its config for `world` (its shard_group
// taken from the config) with devices of `device_bytes` each. Throws ddp::PlanError (a global
// batch smaller than the ranks, and as plan_shard_ranks).
void log_device_plan(const Startup& s, PlannedWorld world, int64_t device_bytes);

// A language model planned from its shapes alone (models/lm/lm_shape.h; no weights, no probe, so
// a plan of any size takes seconds and a few MiB): what the plan takes from the config.
struct ShapePlanInputs {
  int64_t positions = 0;        // tokens per sample (data.context)
  int64_t element_bytes = 4;    // activations: 2 under bf16 and fp16, 4 in fp32
  bool checkpointed = false;    // model.checkpoint_activations
  int64_t loss_chunk_rows = 0;  // the output layer's most rows per chunk
  int64_t first_bucket_bytes = 0, bucket_bytes = 0;  // ddp.first_bucket_mb, ddp.bucket_mb
  c10::ScalarType reduce_dtype = c10::ScalarType::Undefined;
};

// The buckets `mode` makes of `shape`'s parameters, as the Reducer would (by the caps; one per
// unit under parameters, the last unit's first).
std::vector<ddp::BucketLayout> shape_layout(const models::LmShape& shape, ddp::ShardMode mode,
                                            const ShapePlanInputs& in);
// The activation terms of `shape` (computed from the shapes, LmShape::activations).
memory::MemoryEstimate shape_activations(const models::LmShape& shape, const ShapePlanInputs& in);
// plan_device for `shape`: the buckets of `in_force`, the computed activations; with LoRA the
// buckets hold the adapters and the frozen base (fp32, by units) is counted apart.
DevicePlan plan_shape(const models::LmShape& shape, const ShapePlanInputs& in, int64_t global_batch,
                      int64_t micro_batch, const PlannedWorld& world, int64_t device_bytes,
                      double target_fraction, ddp::ShardMode in_force);

// The largest model of `shape`'s family and shape ratio (LmShape::scaled) that fits one sample
// per micro-batch under `mode`; nullopt when not even the smallest does.
std::optional<models::LmShape> largest_fitting(const models::LmShape& shape,
                                               const ShapePlanInputs& in, int64_t global_batch,
                                               const PlannedWorld& world, int64_t device_bytes,
                                               double target_fraction, ddp::ShardMode mode);

// --dry-run --plan-ranks of a language model, from its shapes (the Startup's model, built without
// storage, and its config): the plan's table and verdict as log_device_plan's, then, per
// ddp.shard mode of none, gradients and parameters, the largest model of its family and shape
// ratio that fits. Throws ddp::PlanError as log_device_plan.
void log_shape_plan(const Startup& s, PlannedWorld world, int64_t device_bytes);

}  // namespace launcher
