// docs/DESIGN.md, "The OOM protocol", points 1-3: the plan before step 1.
#include "train/memory_planner.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <map>

#include "core/error_text.h"
#include "ddp/errors.h"
#include "ddp/gather.h"
#include "memory/allocator_guard.h"
#include "memory/memory_stats.h"
#include "memory/oom.h"
#include "models/capabilities.h"
#include "models/deferred_init.h"
#include "models/registry.h"
#include "train/muon.h"
#include "train/precision.h"

namespace train {
namespace {

int64_t largest_bytes(const std::vector<ddp::BucketLayout>& layout) {
  int64_t most = 0;
  for (const auto& b : layout) most = std::max(most, b.bytes());
  return most;
}

// Bytes of the model's parameters and buffers.
int64_t state_bytes(models::Model& model) {
  int64_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += p.nbytes();
  for (const auto& b : model.buffers()) bytes += b.nbytes();
  return bytes;
}

// A frozen base's buffers by units (models::ParameterUnits::frozen_units; LoRA), as flat layouts
// (each unit's elements; fp32) and the buffers themselves.
std::vector<ddp::BucketLayout> frozen_layout(models::Model& model, std::vector<at::Tensor>* held) {
  std::vector<ddp::BucketLayout> layout;
  for (const auto& tensors : models::frozen_unit_buffers(model)) {
    ddp::BucketLayout& unit = layout.emplace_back();
    for (const auto& [name, b] : tensors) {
      unit.offsets.push_back(unit.numel);
      unit.numel += b.numel();
      unit.dtype = b.scalar_type();
      if (held != nullptr) held->push_back(b);
    }
  }
  return layout;
}

// A frozen base's bytes per rank under `mode`: whole, or under parameters its blocks and two
// units in flight (ddp::ReducerOptions::frozen); 0 without one.
int64_t frozen_state_bytes(models::Model& model, int world, ddp::ShardMode mode) {
  const auto as = mode == ddp::ShardMode::kParameters ? mode : ddp::ShardMode::kNone;
  return ddp::shard_footprint(frozen_layout(model, nullptr), world, as).parameters;
}

}  // namespace

std::vector<std::string> gather_failures(ddp::Communicator& control, const std::string& mine) {
  std::vector<std::string> failures;
  for (auto& f : ddp::all_gather_strings(control, mine)) {
    if (!f.empty()) failures.push_back(std::move(f));
  }
  return failures;
}

MemoryPlanner::MemoryPlanner(const TrainerOptions& options, const Placement& placement)
    : options_(options), placement_(placement) {}

void MemoryPlanner::allocate_agreed(const std::string& what, const std::function<void()>& allocate,
                                    bool vote_errors) {
  std::string failure;
  int kind = 0;  // 1: out of memory; 2: another error (vote_errors)
  try {
    allocate();
  } catch (const c10::OutOfMemoryError& e) {
    kind = 1;
    failure =
        fmt::format("rank {}: {}", placement_.rank(), core::first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    if (!vote_errors) throw;
    kind = 2;
    failure = fmt::format("rank {}: {}", placement_.rank(), core::first_line(e.what()));
  }
  at::Tensor failed = at::tensor({kind}, at::kInt);
  placement_.control.all_reduce(failed, ddp::ReduceOp::kMax, "allocation vote");
  const int agreed = failed.data_ptr<int>()[0];
  if (agreed == 0) return;
  const std::vector<std::string> failures = gather_failures(placement_.control, failure);
  if (agreed == 2) {
    throw std::invalid_argument(
        fmt::format("before step 1, {}:\n  {}", what, fmt::join(failures, "\n  ")));
  }
  throw memory::OutOfMemoryFatal(fmt::format(
      "out of memory before step 1, allocating {}:\n  {}\nWhat a rank keeps for the whole run "
      "(parameters, gradient buckets, optimizer state, embedding caches, the data set) must fit "
      "before training starts; memory.fallback only shrinks activations. Give each rank more "
      "memory (memory.cpu_budget_mb on CPU, memory.fraction on a GPU) or use a smaller model or "
      "data set.",
      what, fmt::join(failures, "\n  ")));
}

int64_t MemoryPlanner::target() const {
  const c10::Device device = placement_.device;
  int64_t total = memory::sample_memory(device).total_bytes;
  if (device.is_cuda() && options_.memory.fraction > 0)
    total = static_cast<int64_t>(options_.memory.fraction * total);
  return std::max<int64_t>(0, total);
}

ddp::ShardFootprint MemoryPlanner::footprint(models::Model& model, ddp::ShardMode mode) const {
  const c10::ScalarType wire = options_.ddp.reduce_dtype == ddp::ReduceDtype::kBf16
                                   ? at::kBFloat16
                                   : c10::ScalarType::Undefined;
  const auto layout = planned_layout(model, mode);
  ddp::ShardFootprint f = ddp::shard_footprint(layout, placement_.shard.size(), mode, wire);
  f.parameters += frozen_state_bytes(model, placement_.shard.size(), mode);  // LoRA's base
  if (options_.train.optimizer == OptimizerKind::kMuon) {  // its exchange buffers and workspace
    const MuonPlan plan = plan_muon(layout, parameter_shapes(model), muon_targets(model).matrices,
                                    placement_.shard.size(), options_.train.muon.ns_steps);
    f.optimizer_state +=
        muon_buffer_bytes(plan, placement_.shard.rank(), muon_ns_dtype(options_.train));
  }
  return f;
}

std::vector<ddp::BucketLayout> MemoryPlanner::planned_layout(models::Model& model,
                                                             ddp::ShardMode mode) const {
  // Sizes only (the parameters' numel, which a freed unit keeps): ddp::shard_footprint's input.
  const auto& d = options_.ddp;
  std::vector<ddp::ParamMeta> meta;
  std::map<std::string, size_t> index;
  for (const auto& item : model.named_parameters()) {
    index.emplace(item.key(), meta.size());
    meta.push_back({item.value().numel(), item.value().scalar_type(), placement_.device});
  }
  if (mode != ddp::ShardMode::kParameters) {
    return ddp::assign_buckets(meta, static_cast<int64_t>(d.first_bucket_mb * (1 << 20)),
                               static_cast<int64_t>(d.bucket_mb * (1 << 20)));
  }
  std::vector<std::vector<std::string>> units;
  if (const auto* declared = models::as<models::ParameterUnits>(model)) {
    units = declared->parameter_units();
  } else {
    units.emplace_back();
    for (const auto& [name, i] : index) units.back().push_back(name);
  }
  std::vector<ddp::BucketLayout> layout;
  for (const auto& names : units) {
    ddp::BucketLayout& unit = layout.emplace_back();
    for (const auto& name : names) {
      const ddp::ParamMeta& m = meta.at(index.at(name));
      unit.params.push_back(index.at(name));
      unit.offsets.push_back(unit.numel);
      unit.numel += m.numel;
      unit.dtype = m.dtype;
      unit.device = m.device;
    }
  }
  return layout;
}

int64_t MemoryPlanner::need(models::Model& model, ddp::ShardMode mode, int64_t base) const {
  const ddp::ShardFootprint f = footprint(model, mode);
  if (mode == ddp::ShardMode::kParameters) {
    // The parameters' bytes and a frozen base's, which it shards too (none for a model built
    // without storage).
    std::vector<at::Tensor> tensors = model.parameters();
    frozen_layout(model, &tensors);
    int64_t held = 0;
    for (const auto& t : tensors) {
      if (!models::holds_no_storage(t)) held += t.nbytes();
    }
    // Configured under parameters, this model would have been built without storage
    // (models::builds_without_storage): what this run holds of it now does not count, only the
    // blocks and the units in flight (docs/DESIGN.md, "Parameters sharded").
    if (held > 0 && mode != options_.ddp.shard && models::builds_without_storage(model)) {
      return base - held + f.total();
    }
    // Built whole, the model (in `base`) stays until the broadcast, and is copied into the units'
    // flat buffers unit by unit: base plus the blocks plus one unit (f.parameters counts two).
    return base + f.total() - (held > 0 ? largest_bytes(planned_layout(model, mode)) : 0);
  }
  // Sharding copies the parameters into flat buffers before their old storage goes: that copy is
  // the transient peak when it exceeds the sharded moments. A frozen base (whole, in `base`) is
  // not copied.
  const int64_t params_copy =
      mode == ddp::ShardMode::kNone
          ? 0
          : f.parameters - frozen_state_bytes(model, placement_.shard.size(), mode);
  return base + f.gradients + std::max(f.optimizer_state, params_copy);
}

std::string MemoryPlanner::does_not_fit(models::Model& model, ddp::ShardMode mode, int64_t base,
                                        int64_t target) const {
  std::string advice = "none of the ddp.shard modes fits: use a smaller model or give each rank "
                       "more memory";
  for (const ddp::ShardMode other :
       {ddp::ShardMode::kOptimizer, ddp::ShardMode::kGradients, ddp::ShardMode::kParameters}) {
    if (other <= mode || need(model, other, base) > target) continue;
    advice =
        fmt::format("ddp.shard: {} would keep {} per rank, leaving {} for activations: set "
                    "ddp.shard: {} (or give each rank more memory)",
                    ddp::to_string(other), memory::mib_text(need(model, other, base)),
                    memory::mib_text(target - need(model, other, base)), ddp::to_string(other));
    break;
  }
  const ddp::ShardFootprint f = footprint(model, mode);
  return fmt::format(
      "rank {}: with ddp.shard: {} the state kept for the whole run does not fit before step 1: "
      "parameters {}, gradients {}, optimizer state {}, other tensors (data set, ...) {} need {} "
      "of the {} this rank plans with ({}); {}.",
      placement_.rank(), ddp::to_string(mode), memory::mib_text(f.parameters),
      memory::mib_text(f.gradients), memory::mib_text(f.optimizer_state),
      memory::mib_text(base - f.parameters), memory::mib_text(need(model, mode, base)),
      memory::mib_text(target),
      placement_.device.is_cuda() ? "the device's memory, capped by memory.fraction"
      : memory::CpuAllocatorGuard::instance().budget_bytes() > 0 ? "memory.cpu_budget_mb"
                                                                 : "the machine's memory",
      advice);
}

void MemoryPlanner::check_state_fits(models::Model& model, ddp::ShardMode mode) {
  // Before anything is allocated: what each ddp.shard mode would keep on this rank, from the
  // bucket layout the Reducer will make (docs/DESIGN.md, "The OOM protocol", point 1).
  const c10::Device device = placement_.device;
  int64_t moving = 0;  // parameters and buffers still to be moved to the device
  for (const auto& p : model.parameters()) {
    if (p.device() != device) moving += p.nbytes();
  }
  for (const auto& b : model.buffers()) {
    if (b.device() != device) moving += b.nbytes();
  }
  // What is already there (on CPU the model and the data set), plus what each mode adds.
  const int64_t base = memory::sample_memory(device).tensor_bytes + moving;
  const int64_t plan = target();
  const std::string failure =
      plan > 0 && need(model, mode, base) > plan ? does_not_fit(model, mode, base, plan) : "";
  at::Tensor failed = at::tensor({failure.empty() ? 0 : 1}, at::kInt);
  placement_.control.all_reduce(failed, ddp::ReduceOp::kMax, "state plan vote");
  if (failed.data_ptr<int>()[0] == 0) return;
  throw ddp::PlanError(gather_failures(placement_.control, failure).front());
}

void MemoryPlanner::count_model_state(models::Model& model,
                                      const std::function<void()>& build_caches) {
  estimate_.parameters = state_bytes(model);
  build_caches();
  estimate_.caches = state_bytes(model) - estimate_.parameters;
  estimate_.other = std::max<int64_t>(0, memory::sample_memory(placement_.device).tensor_bytes -
                                             estimate_.parameters - estimate_.caches);
}

void MemoryPlanner::count_parameter_shards(models::Model& model, const ddp::Reducer& reducer) {
  int64_t masters = 0;
  for (const auto& m : reducer.parameter_shards()) masters += m.nbytes();
  // Buffers sharded with their unit (LoRA's frozen base) hold no storage now: their blocks count.
  int64_t buffers = reducer.frozen_shard_bytes();
  for (const auto& b : model.buffers()) {
    if (!models::holds_no_storage(b)) buffers += b.nbytes();
  }
  // Between steps a rank keeps its blocks; in a step at most two units are gathered.
  estimate_.parameters = masters + 2 * reducer.largest_unit_bytes() + buffers;
  // An asynchronous sharded checkpoint's host copy: the master blocks and AdamW's two moments of
  // the same blocks (Note [A bounded shard write]); host memory, so part of a CPU rank's peak.
  const checkpoint::CheckpointOptions& c = options_.checkpoint;
  const bool copies = placement_.device.is_cpu() && !c.dir.empty() && c.async;
  estimate_.checkpoint_copy = copies ? 3 * masters : 0;
}

bool MemoryPlanner::checkpoint_copy_fits(int64_t micro_batch) {
  // The same answer on every rank: a synchronous save is collective at once (Checkpointer::save).
  const int64_t plan = target();
  const bool fits =
      plan <= 0 || estimate_.checkpoint_copy == 0 || estimate_.peak(micro_batch) <= plan;
  at::Tensor failed = at::tensor({fits ? 0 : 1}, at::kInt);
  placement_.control.all_reduce(failed, ddp::ReduceOp::kMax, "checkpoint copy plan vote");
  if (failed.data_ptr<int>()[0] == 0) return true;
  if (placement_.control.rank() == 0) {
    spdlog::info("checkpoint.async: with the host copy of this rank's shard ({:.1f} MiB) the "
                 "step's peak would be {:.1f} MiB, over the plan's {:.1f} MiB: checkpoints are "
                 "written before training goes on, one tensor at a time, without a copy",
                 estimate_.checkpoint_copy / 1048576.0, estimate_.peak(micro_batch) / 1048576.0,
                 plan / 1048576.0);
  }
  estimate_.checkpoint_copy = 0;
  return false;
}

void MemoryPlanner::probe_activations(models::Model& model, ddp::Reducer& reducer, Batches& batches,
                                      UnitGatherer* gate, const Objective* objective) {
  objective_ = objective;
  probe_passes(model, reducer, batches, gate);
  objective_ = nullptr;
}

void MemoryPlanner::probe_passes(models::Model& model, ddp::Reducer& reducer, Batches& batches,
                                 UnitGatherer* gate) {
  const data::Batch batch = batches.first_slice();
  // The loader's buffers live in host memory: part of the peak on CPU only. (On a GPU the
  // micro-batch copied to the device is measured with the activations below.)
  if (placement_.device.is_cpu()) {
    estimate_.loader =
        batches.host_bytes(batch.inputs.nbytes() + batch.targets.nbytes() +
                           (batch.positions.defined() ? batch.positions.nbytes() : 0));
  }
  // Backward accumulates into the bucket views, as in training; no_sync: nothing is reduced.
  reducer.zero_grad();
  const int64_t before = memory::sample_memory(placement_.device).tensor_bytes;
  reducer.begin_micro_batch(/*sync=*/false);
  reducer.set_discard_gradients(gate != nullptr);
  // Two small micro-batches (b2 = 2 b1), halved while even they run out of memory (a large model
  // on a small device); a probe that cannot run one sample ends the start-up (allocate_agreed).
  // Under a gate every rank probes the same sizes (the smallest slice): a pass is collective.
  const ddp::BatchPlan& plan = batches.plan();
  const int64_t slice =
      gate != nullptr ? std::max<int64_t>(1, plan.global_batch / plan.world_size) : plan.per_rank;
  if (placement_.rank() == 0) {  // a large model on a CPU: minutes without a line otherwise
    const int64_t most = std::min<int64_t>(slice, 16);
    spdlog::info("memory plan: measuring the activations of micro-batches of {} and {} samples "
                 "(forward and backward on {}) ...",
                 std::max<int64_t>(1, most / 2), most >= 2 ? 2 * std::max<int64_t>(1, most / 2) : 1,
                 placement_.device.str());
  }
  for (int64_t most = std::min<int64_t>(slice, 16);; most /= 2) {
    const int64_t b1 = std::max<int64_t>(1, most / 2);
    const int64_t b2 = most >= 2 ? 2 * b1 : 1;
    try {
      probe_at(model, batch, b1, b2, gate);
    } catch (const c10::OutOfMemoryError&) {
      if (most <= 1) {
        reducer.set_discard_gradients(false);
        throw;
      }
      continue;
    }
    break;
  }
  reducer.set_discard_gradients(false);
  reducer.zero_grad();
  // What the passes allocated and kept (a GPU library's workspaces, made on first use, which
  // each pass's peak leaves out) stays for the run.
  estimate_.other +=
      std::max<int64_t>(0, memory::sample_memory(placement_.device).tensor_bytes - before);
  // The probe's passes held the units they gathered, which the plan already counts with the
  // parameters (count_parameter_shards: two units).
  if (gate != nullptr) {
    estimate_.activation_fixed =
        std::max<int64_t>(0, estimate_.activation_fixed - 2 * reducer.largest_unit_bytes());
  }
}

int64_t MemoryPlanner::peak_of_pass(models::Model& model, const data::Batch& batch, int64_t samples,
                                    UnitGatherer* gate) {
  const c10::Device device = placement_.device;
  memory::reset_peaks(device);
  const int64_t base = memory::sample_memory(device).tensor_bytes;
  if (gate != nullptr) gate->begin_pass();
  bool failed = false;
  try {
    const auto inputs = batch.inputs.narrow(0, 0, samples).to(device);
    const auto targets = batch.targets.narrow(0, 0, samples).to(device);
    // Packed documents: their positions stay on the host, as in training (Batches).
    const auto positions =
        batch.positions.defined() ? batch.positions.narrow(0, 0, samples) : at::Tensor();
    at::Tensor loss;
    {
      AutocastScope autocast(device, options_.train.precision);  // as in training
      const data::Batch micro{
          inputs, targets, positions,
          batch.pairs.defined() ? batch.pairs.narrow(0, 0, samples) : at::Tensor()};
      loss = objective_ != nullptr ? objective_->loss(micro)
                                   : models::loss_of(model, inputs, targets, positions);
    }
    loss.backward();
  } catch (const c10::OutOfMemoryError&) {
    if (gate == nullptr) throw;
    failed = true;
  }
  const int64_t peak = memory::sample_memory(device).tensor_peak_bytes - base;
  if (gate != nullptr) {
    if (failed) {
      gate->complete_failed_pass();
    } else {
      gate->end_pass();
    }
  }
  const int64_t kept = std::max<int64_t>(0, memory::sample_memory(device).tensor_bytes - base);
  if (gate == nullptr) return peak - kept;
  at::Tensor vote = at::tensor({failed ? 1 : 0}, at::kInt);
  placement_.control.all_reduce(vote, ddp::ReduceOp::kMax, "probe vote");
  if (vote.data_ptr<int>()[0] != 0) {
    C10_THROW_ERROR(
        OutOfMemoryError,
        fmt::format("the activation probe at {} samples ran out of memory on a rank", samples));
  }
  return peak - kept;
}

void MemoryPlanner::probe_at(models::Model& model, const data::Batch& batch, int64_t b1, int64_t b2,
                             UnitGatherer* gate) {
  const auto peak_at = [&](int64_t samples) { return peak_of_pass(model, batch, samples, gate); };
  // A chunked loss (models::ChunkedLoss): its chunk stops growing once full, so the straight line
  // through two sizes below one chunk would overestimate larger micro-batches. A third probe, the
  // first size again with chunks of half its rows, measures the chunk's bytes per row.
  auto* chunked = models::as<models::ChunkedLoss>(model);
  const int64_t rows = chunked != nullptr ? chunked->loss_rows(batch.inputs.narrow(0, 0, 1)) : 0;
  estimate_.loss_rows_per_sample = rows;
  estimate_.loss_chunk_rows = rows > 0 ? chunked->loss_chunk_rows(int64_t{1} << 40) : 0;
  const int64_t peak1 = peak_at(b1);
  const int64_t peak2 = b2 > b1 ? peak_at(b2) : peak1;
  const int64_t x1 = rows > 0 ? chunked->loss_chunk_rows(b1 * rows) : 0;
  if (rows == 0 || x1 < 2) {
    estimate_.activation_per_chunk_row = 0;
    memory::fit_activations(b1, peak1, b2, peak2, &estimate_);
    return;
  }
  const int64_t x2 = chunked->loss_chunk_rows(b2 * rows);
  chunked->set_loss_chunk_rows(x1 / 2);
  const int64_t x3 = chunked->loss_chunk_rows(b1 * rows);
  int64_t peak3 = 0;
  try {
    peak3 = peak_at(b1);
  } catch (...) {
    chunked->set_loss_chunk_rows(0);
    throw;
  }
  chunked->set_loss_chunk_rows(0);
  memory::fit_activations_chunked(b1, peak1, x1, b2, peak2, x2, peak3, x3, &estimate_);
}

int64_t MemoryPlanner::choose_micro_batch(int64_t largest) {
  const int64_t total = target();
  // Capped at the largest slice (the same on every rank; BatchPlan clamps per rank), not this
  // rank's: the minimum over ranks must not split a larger slice into micro-batches of n and 1.
  int64_t micro = largest;
  const auto goal = static_cast<int64_t>(options_.memory.target_fraction * total);
  if (total > 0) micro = memory::largest_micro_batch(estimate_, goal, micro);
  const bool fits = total <= 0 || estimate_.peak(micro) <= goal;
  at::Tensor agreed = at::tensor({micro, fits ? int64_t{1} : int64_t{0}}, at::kLong);
  placement_.control.all_reduce(agreed, ddp::ReduceOp::kMin, "micro-batch agreement");
  micro = agreed.data_ptr<int64_t>()[0];
  if (agreed.data_ptr<int64_t>()[1] == 0 && placement_.rank() == 0) {
    spdlog::warn(
        "train.micro_batch_size auto: even a micro-batch of {} is estimated above "
        "memory.target_fraction = {} of some rank's memory (rank 0: {:.1f} of {:.1f} MiB); "
        "expect out-of-memory fallbacks",
        micro, options_.memory.target_fraction, estimate_.peak(micro) / 1048576.0,
        total / 1048576.0);
  }
  return micro;
}

void MemoryPlanner::compare_estimate(int64_t step, int64_t micro_batch) {
  // Peak since the start table (reset there), the largest over ranks, against the largest plan.
  const c10::Device device = placement_.device;
  at::Tensor v = at::tensor({static_cast<double>(memory::sample_memory(device).tensor_peak_bytes),
                             static_cast<double>(estimate_.peak(micro_batch))},
                            at::kDouble);
  placement_.control.all_reduce(v, ddp::ReduceOp::kMax, "memory estimate check");
  const double measured = v.data_ptr<double>()[0];  // host tensors (control plane)
  const double estimated = v.data_ptr<double>()[1];
  if (placement_.rank() == 0 && measured > 0) {
    spdlog::info("memory after step {}: estimated peak {:.1f} MiB, measured {:.1f} MiB ({:+.0f}%)",
                 step, estimated / 1048576.0, measured / 1048576.0,
                 100.0 * (estimated - measured) / measured);
  }
}

void MemoryPlanner::report_memory(const std::string& title) {
  ddp::Communicator& control = placement_.control;
  const auto mine = memory::sample_memory(placement_.device).to_vector();
  at::Tensor all = at::empty({control.size() * memory::MemorySample::kFields}, at::kDouble);
  control.all_gather(all, at::tensor(mine, at::kDouble), "memory table");
  memory::reset_peaks(placement_.device);
  if (control.rank() != 0) return;
  std::vector<memory::MemorySample> samples;
  const double* v = all.data_ptr<double>();
  for (int r = 0; r < control.size(); ++r) {
    samples.push_back(memory::MemorySample::from_vector(v + r * memory::MemorySample::kFields));
  }
  std::vector<std::string> warnings;
  std::string table =
      memory::format_memory_table(samples, title, options_.memory.high_watermark, &warnings);
  table.pop_back();  // spdlog ends the line
  spdlog::info("{}", table);
  for (const auto& w : warnings) spdlog::warn("memory: {}", w);
}

}  // namespace train
