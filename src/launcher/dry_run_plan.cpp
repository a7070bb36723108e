#include "launcher/dry_run_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ddp/errors.h"
#include "io/safetensors_shards.h"
#include "memory/memory_stats.h"
#include "models/capabilities.h"
#include "train/trainer.h"

namespace launcher {

namespace {

// Which ranks the sharded modes' per-rank state divides by.
std::string describe_shard_ranks(const DevicePlan& plan) {
  const PlannedWorld& w = plan.world;
  const std::string nodes =
      w.ranks_per_node > 0
          ? fmt::format(", {} node(s) of {}", w.ranks / w.ranks_per_node, w.ranks_per_node)
          : "";
  if (w.shard_group == ddp::ShardGroup::kWorld) {
    return fmt::format("ddp.shard_group: world: a shard spans all {} rank(s){}", w.ranks, nodes);
  }
  return fmt::format("ddp.shard_group: node: a shard spans the {} rank(s) of one node "
                     "(--plan-ranks-per-node) and is replicated on each of the {} node(s)",
                     plan.shard_ranks, w.ranks / plan.shard_ranks);
}

}  // namespace

int64_t parse_device_memory(const std::string& text, std::string_view flag) {
  // save_pretrained's sizes (io/safetensors_shards.h), and TB/TiB for the devices to come.
  std::string t = text;
  int64_t scale = 1;
  if (t.size() > 3 && t.ends_with("TiB")) {
    t = t.substr(0, t.size() - 3) + "GiB";
    scale = 1024;
  } else if (t.size() > 2 && t.ends_with("TB")) {
    t = t.substr(0, t.size() - 2) + "GB";
    scale = 1000;
  }
  int64_t bytes = 0;
  try {
    bytes = io::parse_shard_size(t) * scale;
  } catch (const std::exception&) {
    bytes = 0;
  }
  if (bytes <= 0) {
    throw std::invalid_argument(fmt::format(
        "{} '{}' is not a memory size: write bytes or a number with a unit, e.g. 80GiB, 80GB, "
        "81920MiB",
        flag, text));
  }
  return bytes;
}

int64_t cuda_reserve_bytes() {
  int64_t total = 0;
  for (const auto& r : kCudaReserves) total += r.bytes;
  return total;
}

int plan_shard_ranks(const PlannedWorld& world) {
  const int n = world.ranks;
  const int m = world.ranks_per_node;
  if (m > 0 && n % m != 0) {
    throw ddp::PlanError(fmt::format(
        "--plan-ranks-per-node {} does not divide --plan-ranks {}: every node runs the same "
        "number of ranks; plan a multiple of {} ranks or another number per node",
        m, n, m));
  }
  if (world.shard_group == ddp::ShardGroup::kWorld) return n;
  if (m <= 0) {
    throw ddp::PlanError(fmt::format(
        "ddp.shard_group is node: the shards span the ranks of one node, so the plan needs "
        "--plan-ranks-per-node M (the ranks on each node, e.g. its GPUs; M divides --plan-ranks "
        "{})",
        n));
  }
  return m;
}

DevicePlan plan_device(const std::vector<ddp::BucketLayout>& layout, c10::ScalarType reduce_dtype,
                       const memory::MemoryEstimate& probe, int64_t global_batch,
                       int64_t micro_batch, const PlannedWorld& world, int64_t device_bytes,
                       double target_fraction, ddp::ShardMode in_force,
                       const std::vector<ddp::BucketLayout>& frozen) {
  const int ranks = world.ranks;
  if (global_batch < ranks) {
    throw ddp::PlanError(fmt::format(
        "--plan-ranks {} is more than train.global_batch_size = {}: every rank needs at least one "
        "sample; plan fewer ranks or a larger global batch",
        ranks, global_batch));
  }
  DevicePlan plan;
  plan.world = world;
  plan.shard_ranks = plan_shard_ranks(world);
  plan.device_bytes = device_bytes;
  plan.in_force = in_force;
  plan.budget = static_cast<int64_t>(target_fraction * static_cast<double>(device_bytes)) -
                cuda_reserve_bytes();
  plan.batch = ddp::BatchPlan::make(global_batch, ranks, 0, micro_batch);
  // The activation terms only: the host-side loader and data set are not on the device.
  memory::MemoryEstimate& a = plan.activations;
  a.activation_fixed = probe.activation_fixed;
  a.activation_per_sample = probe.activation_per_sample;
  a.activation_per_chunk_row = probe.activation_per_chunk_row;
  a.loss_rows_per_sample = probe.loss_rows_per_sample;
  a.loss_chunk_rows = probe.loss_chunk_rows;
  a.caches = probe.caches;
  for (size_t m = 0; m < ddp::kShardModeNames.size(); ++m) {
    ModePlan row;
    row.mode = static_cast<ddp::ShardMode>(m);
    row.state = ddp::shard_footprint(layout, plan.shard_ranks, row.mode, reduce_dtype);
    // The frozen tensors as parameters that take no gradient and no optimizer state.
    const auto frozen_mode =
        row.mode == ddp::ShardMode::kParameters ? row.mode : ddp::ShardMode::kNone;
    row.state.parameters += ddp::shard_footprint(frozen, plan.shard_ranks, frozen_mode).parameters;
    memory::MemoryEstimate e = a;
    e.parameters = row.state.parameters;
    e.gradients = row.state.gradients;
    e.optimizer_state = row.state.optimizer_state;
    // As choose_micro_batch: capped at the largest slice (rank 0's, the first G mod W take one
    // more).
    const int64_t largest = plan.batch.per_rank;
    const int64_t micro = memory::largest_micro_batch(e, plan.budget, largest);
    row.micro_auto = e.peak(micro) <= plan.budget ? micro : 0;
    row.configured_fits = e.peak(plan.batch.micro_batch) <= plan.budget;
    if (micro_batch <= 0) row.configured_fits = row.micro_auto > 0;
    row.least_peak = e.peak(1);
    plan.modes.push_back(row);
  }
  const int64_t picked = plan.modes[static_cast<size_t>(in_force)].micro_auto;
  if (micro_batch <= 0)
    plan.batch = ddp::BatchPlan::make(global_batch, ranks, 0, std::max<int64_t>(1, picked));
  return plan;
}

std::vector<PlanFit> find_fits(const PlanOf& plan_of, int64_t micro_batch, bool checkpointed,
                               bool can_checkpoint) {
  std::vector<PlanFit> fits(ddp::kShardModeNames.size());
  std::vector<bool> turn_on{false};
  if (!checkpointed && can_checkpoint) turn_on.push_back(true);
  for (const bool checkpointing : turn_on) {
    for (size_t m = 0; m < fits.size(); ++m) {
      PlanFit& fit = fits[m];
      if (fit.micro_batch > 0) continue;  // fits without this lever
      fit.mode = static_cast<ddp::ShardMode>(m);
      const DevicePlan plan = plan_of(fit.mode, checkpointed || checkpointing);
      const ModePlan& row = plan.modes[m];
      fit.checkpoint_activations = checkpointing;
      fit.least_peak = row.least_peak;
      if (row.micro_auto == 0) continue;
      fit.micro_batch =
          micro_batch > 0 && row.configured_fits ? plan.batch.micro_batch : row.micro_auto;
    }
  }
  return fits;
}

namespace {

// What the verdict adds where the configuration does not fit and the fits were searched.
std::string fit_verdict(const std::vector<PlanFit>& fits, int64_t micro_batch,
                        int64_t configured_micro) {
  bool any = false;
  for (const PlanFit& fit : fits) {
    if (fit.micro_batch == 0) continue;
    any = true;
    if (!fit.checkpoint_activations && (micro_batch <= 0 || fit.micro_batch == configured_micro)) {
      return fmt::format("; ddp.shard: {} fits", ddp::to_string(fit.mode));
    }
  }
  return any ? "; no ddp.shard mode fits as configured"
             : "; no ddp.shard mode fits, even with every lever";
}

// A fit as a line: the mode, the micro-batch, the fallback rungs whose levers it pulls, and the
// settings to add to the command line.
std::string describe_fit(const PlanFit& fit, const DevicePlan& plan, int64_t micro_batch) {
  std::vector<std::string> rungs, settings;
  if (fit.mode != plan.in_force) {
    settings.push_back(fmt::format("--set ddp.shard={}", ddp::to_string(fit.mode)));
    if (fit.mode == ddp::ShardMode::kOptimizer) rungs.emplace_back("shard_optimizer");
    if (fit.mode == ddp::ShardMode::kParameters) rungs.emplace_back("shard_parameters");
  }
  if (micro_batch > 0 && fit.micro_batch != plan.batch.micro_batch) {
    settings.push_back(fmt::format("--set train.micro_batch_size={}", fit.micro_batch));
    rungs.emplace_back("halve_micro_batch");
  }
  if (fit.checkpoint_activations) {
    settings.emplace_back("--set model.checkpoint_activations=true");
    rungs.emplace_back("checkpoint_activations");
  }
  return fmt::format(
      "what fits: ddp.shard: {} at micro-batch {}{}{}{}; add to the command line: {}",
      ddp::to_string(fit.mode), fit.micro_batch, micro_batch <= 0 ? " (auto's pick)" : "",
      fit.checkpoint_activations ? " with activation checkpointing" : "",
      rungs.empty() ? ""
                    : fmt::format(" (memory.fallback's {} {}, taken before the run)",
                                  rungs.size() == 1 ? "rung" : "rungs", fmt::join(rungs, ", ")),
      fmt::join(settings, " "));
}

// The lines of what fits: one per mode that does, or what the most sharded needs at its least.
std::vector<std::string> describe_fits(const DevicePlan& plan, int64_t micro_batch) {
  std::vector<std::string> lines;
  for (const PlanFit& fit : plan.fits) {
    if (fit.micro_batch > 0) lines.push_back(describe_fit(fit, plan, micro_batch));
  }
  if (!lines.empty()) return lines;
  const PlanFit& most = plan.fits.back();  // parameters
  lines.push_back(fmt::format(
      "nothing fits even with every lever: ddp.shard: {}{} at micro-batch 1 needs {} of the {} "
      "budget; plan more ranks or more device memory per rank, or a smaller model",
      ddp::to_string(most.mode),
      most.checkpoint_activations || plan.checkpointed ? " with activation checkpointing" : "",
      memory::mib_text(most.least_peak), memory::mib_text(plan.budget)));
  return lines;
}

// The plan's budget, shards, activations and table of modes.
std::vector<std::string> describe_modes(const DevicePlan& plan) {
  std::vector<std::string> lines;
  std::string reserves;
  for (const auto& r : kCudaReserves)
    reserves += fmt::format(", {} {}", r.name, memory::mib_text(r.bytes));
  lines.push_back(fmt::format(
      "plan for {} rank(s) of {} device memory: budget {} (memory.target_fraction of it, less "
      "the reserves{})",
      plan.world.ranks, memory::mib_text(plan.device_bytes), memory::mib_text(plan.budget),
      reserves));
  lines.push_back(describe_shard_ranks(plan));
  const memory::MemoryEstimate& a = plan.activations;
  lines.push_back(fmt::format(
      "activations ({} estimate of CUDA memory, at the config's precision): {} fixed + "
      "{:.3f} MiB/sample{}",
      plan.activations_computed ? "computed from the shapes:" : "CPU-measured",
      memory::mib_text(a.activation_fixed), a.activation_per_sample / 1048576.0,
      a.activation_per_chunk_row > 0 ? fmt::format(" + the loss's chunk {:.3f} MiB/row",
                                                   a.activation_per_chunk_row / 1048576.0)
                                     : ""));
  lines.push_back(fmt::format("{:<10} {:>14} {:>14} {:>14} {:>14}  {}", "ddp.shard", "parameters",
                              "gradients", "optimizer", "state total", "micro-batch auto"));
  for (const ModePlan& m : plan.modes) {
    lines.push_back(
        fmt::format("{:<10} {:>14} {:>14} {:>14} {:>14}  {}{}", ddp::to_string(m.mode),
                    memory::mib_text(m.state.parameters), memory::mib_text(m.state.gradients),
                    memory::mib_text(m.state.optimizer_state), memory::mib_text(m.state.total()),
                    m.micro_auto > 0 ? fmt::format("{}", m.micro_auto) : "none fits",
                    m.mode == plan.in_force ? "  (in force)" : ""));
  }
  return lines;
}

}  // namespace

std::vector<std::string> describe_device_plan(const DevicePlan& plan, int64_t micro_batch) {
  const ddp::ShardMode in_force = plan.in_force;
  std::vector<std::string> lines = describe_modes(plan);
  lines.push_back(fmt::format("global batch {} at {} rank(s): rank 0 takes {}",
                              plan.batch.global_batch, plan.world.ranks, plan.batch.describe()));
  const ModePlan& force = plan.modes[static_cast<size_t>(in_force)];
  std::string verdict;
  if (micro_batch <= 0) {
    verdict = force.micro_auto > 0
                  ? fmt::format("micro_batch_size auto would pick {} under ddp.shard: {}",
                                force.micro_auto, ddp::to_string(in_force))
                  : fmt::format("micro_batch_size auto: not even 1 sample fits under ddp.shard: {}",
                                ddp::to_string(in_force));
  } else {
    verdict =
        fmt::format("train.micro_batch_size = {} {} under ddp.shard: {}", plan.batch.micro_batch,
                    force.configured_fits ? "fits" : "does not fit", ddp::to_string(in_force));
  }
  const bool advise = !force.configured_fits && !plan.fits.empty();
  if (advise) verdict += fit_verdict(plan.fits, micro_batch, plan.batch.micro_batch);
  lines.push_back(verdict);
  if (advise) {
    for (auto& line : describe_fits(plan, micro_batch)) lines.push_back(std::move(line));
  }
  return lines;
}

void log_device_plan(const Startup& s, PlannedWorld world, int64_t device_bytes) {
  const train::Trainer& trainer = *s.trainer;
  const config::Config& c = s.config;
  const auto wire =
      c.ddp.reduce_dtype == ddp::ReduceDtype::kBf16 ? at::kBFloat16 : c10::ScalarType::Undefined;
  world.shard_group = c.ddp.shard_group;
  // The probe measured the activations of the config's checkpointing: the modes are the levers.
  const PlanOf plan_of = [&](ddp::ShardMode mode, bool) {
    return plan_device(trainer.reducer().layout(), wire, trainer.memory_estimate(),
                       c.train.global_batch_size, c.train.micro_batch_size, world, device_bytes,
                       c.memory.target_fraction, mode);
  };
  DevicePlan plan = plan_of(c.ddp.shard, false);
  plan.checkpointed = models::checkpoints_activations(*s.model);
  if (!plan.modes[static_cast<size_t>(c.ddp.shard)].configured_fits) {
    plan.fits = find_fits(plan_of, c.train.micro_batch_size, plan.checkpointed, false);
  }
  for (const auto& line : describe_device_plan(plan, c.train.micro_batch_size)) {
    spdlog::info("{}", line);
  }
}

std::vector<ddp::BucketLayout> shape_layout(const models::LmShape& shape, ddp::ShardMode mode,
                                            const ShapePlanInputs& in) {
  const auto params = shape.parameters();
  const c10::Device device(c10::kCUDA, 0);  // the planned device's buckets: the sizes are the same
  if (mode != ddp::ShardMode::kParameters) {
    std::vector<ddp::ParamMeta> meta;
    for (const auto& p : params) meta.push_back({p.numel, at::kFloat, device});
    return ddp::assign_buckets(meta, in.first_bucket_bytes, in.bucket_bytes);
  }
  std::vector<ddp::BucketLayout> units(shape.units());
  for (size_t k = 0; k < params.size(); ++k) {
    ddp::BucketLayout& u = units[params[k].unit];
    u.params.push_back(k);
    u.offsets.push_back(u.numel);
    u.numel += params[k].numel;
    u.dtype = at::kFloat;
    u.device = device;
  }
  return {units.rbegin(), units.rend()};  // the last unit's bucket first
}

memory::MemoryEstimate shape_activations(const models::LmShape& shape, const ShapePlanInputs& in) {
  const auto a = shape.activations(in.positions, in.element_bytes, in.checkpointed);
  memory::MemoryEstimate e;
  e.activation_fixed = a.fixed;
  e.activation_per_sample = a.per_sample;
  e.activation_per_chunk_row = a.per_chunk_row;
  e.loss_rows_per_sample = in.positions;
  e.loss_chunk_rows = in.loss_chunk_rows;
  return e;
}

DevicePlan plan_shape(const models::LmShape& shape, const ShapePlanInputs& in, int64_t global_batch,
                      int64_t micro_batch, const PlannedWorld& world, int64_t device_bytes,
                      double target_fraction, ddp::ShardMode in_force) {
  const auto base = shape.frozen();  // LoRA's base: fp32 buffers, by units
  std::vector<ddp::BucketLayout> frozen(base.empty() ? 0 : shape.units());
  for (const auto& p : base) {
    frozen[p.unit].numel += p.numel;
    frozen[p.unit].dtype = at::kFloat;
  }
  DevicePlan plan = plan_device(shape_layout(shape, in_force, in), in.reduce_dtype,
                                shape_activations(shape, in), global_batch, micro_batch, world,
                                device_bytes, target_fraction, in_force, frozen);
  plan.activations_computed = true;
  plan.checkpointed = in.checkpointed;
  return plan;
}

std::optional<models::LmShape> largest_fitting(const models::LmShape& shape,
                                               const ShapePlanInputs& in, int64_t global_batch,
                                               const PlannedWorld& world, int64_t device_bytes,
                                               double target_fraction, ddp::ShardMode mode) {
  const auto fits = [&](double factor) {
    const DevicePlan p = plan_shape(shape.scaled(factor), in, global_batch, 1, world, device_bytes,
                                    target_fraction, mode);
    return p.modes[static_cast<size_t>(mode)].micro_auto > 0;
  };
  // The parameters grow as the factor's cube: a bisection on its logarithm, 1/64 to 64 times.
  double lo = 1.0 / 64, hi = 64.0;
  if (!fits(lo)) return std::nullopt;
  if (fits(hi)) return shape.scaled(hi);
  for (int i = 0; i < 40; ++i) {
    const double mid = std::sqrt(lo * hi);
    (fits(mid) ? lo : hi) = mid;
  }
  return shape.scaled(lo);
}

namespace {

std::string describe_shape(const models::LmShape& s) {
  return fmt::format("{:.2f}B parameters ({} blocks, d_model {}, {} heads over {} kv heads of {}, "
                     "MLP {})",
                     static_cast<double>(s.parameter_count()) / 1e9, s.layers, s.d_model, s.heads,
                     s.kv_heads, s.head_dim, s.intermediate);
}

ShapePlanInputs shape_inputs(const Startup& s) {
  const config::Config& c = s.config;
  ShapePlanInputs in;
  // A preference pair (train.objective: dpo, simpo) is two rows of data.context positions.
  in.positions = c.data.context * (c.train.objective == train::ObjectiveKind::kLm ? 1 : 2);
  const auto precision = c.train.precision;
  in.element_bytes =
      precision == train::Precision::kBf16 || precision == train::Precision::kFp16 ? 2 : 4;
  in.checkpointed = models::checkpoints_activations(*s.model);
  if (const auto* chunked = models::as<models::ChunkedLoss>(*s.model)) {
    in.loss_chunk_rows = chunked->loss_chunk_rows(int64_t{1} << 40);
  }
  in.first_bucket_bytes = static_cast<int64_t>(c.ddp.first_bucket_mb * (1 << 20));
  in.bucket_bytes = static_cast<int64_t>(c.ddp.bucket_mb * (1 << 20));
  in.reduce_dtype =
      c.ddp.reduce_dtype == ddp::ReduceDtype::kBf16 ? at::kBFloat16 : c10::ScalarType::Undefined;
  return in;
}

}  // namespace

void log_shape_plan(const Startup& s, PlannedWorld world, int64_t device_bytes) {
  const config::Config& c = s.config;
  const models::LmShape shape = models::as<models::ShapePlanning>(*s.model)->lm_shape();
  const ShapePlanInputs in = shape_inputs(s);
  world.shard_group = c.ddp.shard_group;
  const PlanOf plan_of = [&](ddp::ShardMode mode, bool checkpointed) {
    ShapePlanInputs with = in;
    with.checkpointed = checkpointed;
    return plan_shape(shape, with, c.train.global_batch_size, c.train.micro_batch_size, world,
                      device_bytes, c.memory.target_fraction, mode);
  };
  DevicePlan plan = plan_of(c.ddp.shard, in.checkpointed);
  if (!plan.modes[static_cast<size_t>(c.ddp.shard)].configured_fits) {
    plan.fits = find_fits(plan_of, c.train.micro_batch_size, in.checkpointed,
                          models::as<models::ActivationCheckpointing>(*s.model) != nullptr);
  }
  spdlog::info("model: {} {} at {} positions per sample; activations computed from the shapes "
               "(docs/DESIGN.md, \"Planning without the device\"), not probed",
               c.model.name, describe_shape(shape), in.positions);
  for (const auto& line : describe_device_plan(plan, c.train.micro_batch_size)) {
    spdlog::info("{}", line);
  }
  for (const ddp::ShardMode mode :
       {ddp::ShardMode::kNone, ddp::ShardMode::kGradients, ddp::ShardMode::kParameters}) {
    const auto largest = largest_fitting(shape, in, c.train.global_batch_size, world, device_bytes,
                                         c.memory.target_fraction, mode);
    spdlog::info("largest {} of this shape ratio that fits under ddp.shard: {} (micro-batch 1): {}",
                 c.model.name, ddp::to_string(mode),
                 largest ? describe_shape(*largest) : std::string("none"));
  }
}

}  // namespace launcher
