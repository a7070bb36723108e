// The Trainer's memory plan and out-of-memory protocol (docs/DESIGN.md, "The OOM protocol"): the
// agreed allocation of persistent state before step 1, the activation probe, the micro-batch
// that fits, the memory tables, and the fallback every rank takes after a failed vote (the
// rungs: memory/fallback.h). The training step itself is in trainer.cpp.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <map>

#include "ddp/errors.h"
#include "ddp/gather.h"
#include "memory/allocator_guard.h"
#include "memory/memory_stats.h"
#include "memory/oom.h"
#include "models/capabilities.h"
#include "train/error_text.h"
#include "train/precision.h"
#include "train/trainer.h"

namespace train {

void Trainer::allocate_agreed(const std::string& what, const std::function<void()>& allocate) {
  std::string failure;
  try {
    allocate();
  } catch (const c10::OutOfMemoryError& e) {
    failure = fmt::format("rank {}: {}", control_.rank(), first_line(e.what_without_backtrace()));
  }
  at::Tensor failed = at::tensor({failure.empty() ? 0 : 1}, at::kInt);
  control_.all_reduce(failed, ddp::ReduceOp::kMax, "allocation vote");
  if (failed.data_ptr<int>()[0] == 0) return;
  const std::vector<std::string> failures = gather_failures(failure);
  throw memory::OutOfMemoryFatal(fmt::format(
      "out of memory before step 1, allocating {}:\n  {}\nWhat a rank keeps for the whole run "
      "(parameters, gradient buckets, optimizer state, embedding caches, the data set) must fit "
      "before training starts; memory.fallback only shrinks activations. Give each rank more "
      "memory (memory.cpu_budget_mb on CPU, memory.fraction on a GPU) or use a smaller model or "
      "data set.",
      what, fmt::join(failures, "\n  ")));
}

namespace {

// Memory a rank plans with: memory.cpu_budget_mb (or the machine) on CPU, the device's memory
// capped by memory.fraction on a GPU. 0 when unknown.
int64_t memory_target(c10::Device device, const memory::MemoryOptions& options) {
  int64_t total = memory::sample_memory(device).total_bytes;
  if (device.is_cuda() && options.fraction > 0)
    total = static_cast<int64_t>(options.fraction * total);
  return std::max<int64_t>(0, total);
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

int64_t largest_bytes(const std::vector<ddp::BucketLayout>& layout) {
  int64_t most = 0;
  for (const auto& b : layout) most = std::max(most, b.bytes());
  return most;
}

}  // namespace

ddp::ShardFootprint Trainer::footprint(ddp::ShardMode mode) const {
  return ddp::shard_footprint(planned_layout(mode), shard_comm_.size(), mode, reduce_wire_dtype());
}

std::vector<ddp::BucketLayout> Trainer::planned_layout(ddp::ShardMode mode) const {
  // Sizes only (the parameters' numel, which a freed unit keeps): ddp::shard_footprint's input.
  const auto& d = options_.ddp;
  std::vector<ddp::ParamMeta> meta;
  std::map<std::string, size_t> index;
  for (const auto& item : model_->named_parameters()) {
    index.emplace(item.key(), meta.size());
    meta.push_back({item.value().numel(), item.value().scalar_type(), device_});
  }
  if (mode != ddp::ShardMode::kParameters) {
    return ddp::assign_buckets(meta, static_cast<int64_t>(d.first_bucket_mb * (1 << 20)),
                               static_cast<int64_t>(d.bucket_mb * (1 << 20)));
  }
  // One bucket per unit (one unit: a model without models::ParameterUnits).
  std::vector<std::vector<std::string>> units;
  if (const auto* declared = models::as<models::ParameterUnits>(*model_)) {
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
      unit.numel += m.numel;
      unit.dtype = m.dtype;
      unit.device = m.device;
    }
  }
  return layout;
}

void Trainer::check_state_fits() {
  // Before anything is allocated: what each ddp.shard mode would keep on this rank, from the
  // bucket layout the Reducer will make (docs/DESIGN.md, "The OOM protocol", point 1).
  int64_t moving = 0;  // parameters and buffers still to be moved to the device
  for (const auto& p : model_->parameters()) {
    if (p.device() != device_) moving += p.nbytes();
  }
  for (const auto& b : model_->buffers()) {
    if (b.device() != device_) moving += b.nbytes();
  }
  const int64_t target = memory_target(device_, options_.memory);
  // What is already there (on CPU the model and the data set), plus what each mode adds. Sharding
  // copies the parameters into flat buffers before their old storage goes: that copy is the
  // transient peak when it exceeds the sharded moments.
  const int64_t base = memory::sample_memory(device_).tensor_bytes + moving;
  const auto need = [&](ddp::ShardMode mode) {
    const ddp::ShardFootprint f = footprint(mode);
    if (mode == ddp::ShardMode::kParameters) {
      // The whole model (in `base`) stays until the broadcast, and is copied into the units' flat
      // buffers unit by unit: base plus the blocks plus one unit (f.parameters counts two).
      const int64_t unit = largest_bytes(planned_layout(mode));
      return base + f.total() - unit;
    }
    const int64_t params_copy = mode == ddp::ShardMode::kNone ? 0 : f.parameters;
    return base + f.gradients + std::max(f.optimizer_state, params_copy);
  };
  std::string failure;
  if (target > 0 && need(shard_) > target) {
    std::string advice = "none of the ddp.shard modes fits: use a smaller model or give each rank "
                         "more memory";
    for (const ddp::ShardMode mode :
         {ddp::ShardMode::kOptimizer, ddp::ShardMode::kGradients, ddp::ShardMode::kParameters}) {
      if (mode <= shard_ || need(mode) > target) continue;
      advice = fmt::format("ddp.shard: {} would keep {} per rank, leaving {} for activations: "
                           "set ddp.shard: {} (or give each rank more memory)",
                           ddp::to_string(mode), mib(need(mode)), mib(target - need(mode)),
                           ddp::to_string(mode));
      break;
    }
    const ddp::ShardFootprint f = footprint(shard_);
    failure = fmt::format(
        "rank {}: with ddp.shard: {} the state kept for the whole run does not fit before step 1: "
        "parameters {}, gradients {}, optimizer state {}, other tensors (data set, ...) {} need {} "
        "of the {} this rank plans with ({}); {}.",
        control_.rank(), ddp::to_string(shard_), mib(f.parameters), mib(f.gradients),
        mib(f.optimizer_state), mib(base - f.parameters), mib(need(shard_)), mib(target),
        device_.is_cuda() ? "the device's memory, capped by memory.fraction"
        : memory::CpuAllocatorGuard::instance().budget_bytes() > 0 ? "memory.cpu_budget_mb"
                                                                   : "the machine's memory",
        advice);
  }
  at::Tensor failed = at::tensor({failure.empty() ? 0 : 1}, at::kInt);
  control_.all_reduce(failed, ddp::ReduceOp::kMax, "state plan vote");
  if (failed.data_ptr<int>()[0] == 0) return;
  const std::vector<std::string> failures = gather_failures(failure);
  throw ddp::PlanError(failures.front());
}

void Trainer::probe_activations() {
  const data::Batch batch = dataset_.get(sampler_.indices(0, plan_.offset, plan_.per_rank));
  // The loader's buffers live in host memory: part of the peak on CPU only. (On a GPU the
  // micro-batch copied to the device is measured with the activations below.)
  if (device_.is_cpu()) {
    estimate_.loader =
        sampler_.buffer_bytes() +
        data::Loader::buffer_bytes(options_.loader, batch.inputs.nbytes() + batch.targets.nbytes());
  }
  // Backward accumulates into the bucket views, as in training; no_sync: nothing is reduced.
  reducer_->zero_grad();
  reducer_->begin_micro_batch(/*sync=*/false);
  // Two small micro-batches (b2 = 2 b1), halved while even they run out of memory (a large model
  // on a small device); a probe that cannot run one sample ends the start-up (allocate_agreed).
  const auto peak_at = [&](int64_t samples) {
    memory::reset_peaks(device_);
    const int64_t base = memory::sample_memory(device_).tensor_bytes;
    {
      const auto inputs = batch.inputs.narrow(0, 0, samples).to(device_);
      const auto targets = batch.targets.narrow(0, 0, samples).to(device_);
      at::Tensor loss;
      {
        AutocastScope autocast(device_, precision_);  // as in training: it sets activations
        loss = model_->loss(inputs, targets);
      }
      loss.backward();
    }
    return memory::sample_memory(device_).tensor_peak_bytes - base;
  };
  // A chunked loss (models::ChunkedLoss): its chunk stops growing once full, so the straight line
  // through two sizes below one chunk would overestimate larger micro-batches. A third probe, the
  // first size again with chunks of half its rows, measures the chunk's bytes per row.
  auto* chunked = models::as<models::ChunkedLoss>(*model_);
  const int64_t rows_per_sample =
      chunked != nullptr ? chunked->loss_rows(batch.inputs.narrow(0, 0, 1)) : 0;
  estimate_.loss_rows_per_sample = rows_per_sample;
  estimate_.loss_chunk_rows = rows_per_sample > 0 ? chunked->loss_chunk_rows(int64_t{1} << 40) : 0;
  for (int64_t most = std::min<int64_t>(plan_.per_rank, 16);; most /= 2) {
    const int64_t b1 = std::max<int64_t>(1, most / 2);
    const int64_t b2 = most >= 2 ? 2 * b1 : 1;
    try {
      const int64_t peak1 = peak_at(b1);
      const int64_t peak2 = b2 > b1 ? peak_at(b2) : peak1;
      const int64_t x1 = rows_per_sample > 0 ? chunked->loss_chunk_rows(b1 * rows_per_sample) : 0;
      if (rows_per_sample > 0 && x1 >= 2) {
        const int64_t x2 = chunked->loss_chunk_rows(b2 * rows_per_sample);
        chunked->set_loss_chunk_rows(x1 / 2);
        const int64_t x3 = chunked->loss_chunk_rows(b1 * rows_per_sample);
        int64_t peak3 = 0;
        try {
          peak3 = peak_at(b1);
        } catch (...) {
          chunked->set_loss_chunk_rows(0);
          throw;
        }
        chunked->set_loss_chunk_rows(0);
        memory::fit_activations_chunked(b1, peak1, x1, b2, peak2, x2, peak3, x3, &estimate_);
      } else {
        estimate_.activation_per_chunk_row = 0;
        memory::fit_activations(b1, peak1, b2, peak2, &estimate_);
      }
    } catch (const c10::OutOfMemoryError&) {
      if (most <= 1) throw;
      continue;
    }
    break;
  }
  reducer_->zero_grad();
}

void Trainer::choose_micro_batch() {
  if (options_.train.micro_batch_size > 0) return;
  int64_t total = memory::sample_memory(device_).total_bytes;
  // memory.fraction caps this process's share of the GPU (the caching allocator's limit).
  if (device_.is_cuda() && options_.memory.fraction > 0) {
    total = static_cast<int64_t>(options_.memory.fraction * total);
  }
  // Capped at the largest slice (the same on every rank; BatchPlan clamps per rank), not this
  // rank's: the minimum over ranks must not split a larger slice into micro-batches of n and 1.
  int64_t micro = initial_micro_batch(options_.train, control_.size());
  const auto target = static_cast<int64_t>(options_.memory.target_fraction * total);
  if (total > 0) micro = memory::largest_micro_batch(estimate_, target, micro);
  const bool fits = total <= 0 || estimate_.peak(micro) <= target;
  at::Tensor agreed = at::tensor({micro, fits ? int64_t{1} : int64_t{0}}, at::kLong);
  control_.all_reduce(agreed, ddp::ReduceOp::kMin, "micro-batch agreement");
  micro_batch_ = agreed.data_ptr<int64_t>()[0];
  if (agreed.data_ptr<int64_t>()[1] == 0 && control_.rank() == 0) {
    spdlog::warn(
        "train.micro_batch_size auto: even a micro-batch of {} is estimated above "
        "memory.target_fraction = {} of some rank's memory (rank 0: {:.1f} of {:.1f} MiB); "
        "expect out-of-memory fallbacks",
        micro_batch_, options_.memory.target_fraction, estimate_.peak(micro_batch_) / 1048576.0,
        total / 1048576.0);
  }
  plan_ = make_plan(micro_batch_);
}

std::vector<std::string> Trainer::gather_failures(const std::string& mine) {
  std::vector<std::string> failures;
  for (auto& f : ddp::all_gather_strings(control_, mine)) {
    if (!f.empty()) failures.push_back(std::move(f));
  }
  return failures;
}

memory::FallbackLadder Trainer::make_ladder() {
  memory::RungEffects effects;
  effects.halve_micro_batch = [this](int64_t old_micro, int64_t new_micro) {
    return halve_micro_batch(old_micro, new_micro);
  };
  // A model that can checkpoint activations (and does not already) offers that rung.
  auto* checkpointing = models::as<models::ActivationCheckpointing>(*model_);
  if (checkpointing != nullptr && !models::checkpoints_activations(*model_)) {
    effects.checkpoint_activations = [this, checkpointing] {
      checkpointing->set_checkpoint_activations(true);
      return fmt::format("each block is now recomputed in backward instead of keeping its "
                         "activations; micro-batch {} unchanged",
                         plan_.micro_batch);
    };
  }
  if (models::has_cache(*model_)) {
    effects.uncache_embeddings = [this] {
      models::as<models::EmbeddingCache>(*model_)->uncache();
      return std::string("embedding caches released, embeddings now computed per micro-batch");
    };
  }
  if (!reducer_->sharded() && control_.size() > 1) {
    effects.shard_optimizer = [this] { return shard_optimizer(); };
  }
  if (shard_ != ddp::ShardMode::kParameters && control_.size() > 1) {
    effects.shard_parameters = [this] { return shard_parameters(); };
  }
  return memory::FallbackLadder(options_.memory.fallback, micro_batch_,
                                options_.memory.min_micro_batch, std::move(effects));
}

std::string Trainer::halve_micro_batch(int64_t old_micro_batch, int64_t new_micro_batch) {
  const ddp::BatchPlan old_plan = plan_;
  micro_batch_ = new_micro_batch;
  plan_ = make_plan(micro_batch_);
  return fmt::format("micro-batch {} -> {}, accumulation {} -> {} (rank 0); global batch {} "
                     "unchanged",
                     old_micro_batch, plan_.micro_batch, old_plan.accumulation(),
                     plan_.accumulation(), plan_.global_batch);
}

std::string Trainer::shard_optimizer() {
  const int64_t before = estimate_.gradients + estimate_.optimizer_state;
  shard_optimizer_in_place();
  return fmt::format("now ddp.shard: optimizer, each rank keeps the AdamW moments of its 1/{} of "
                     "the parameters (gradients and optimizer state {} -> {} per rank); "
                     "micro-batch {} unchanged",
                     control_.size(), mib(before),
                     mib(estimate_.gradients + estimate_.optimizer_state), plan_.micro_batch);
}

void Trainer::fall_back(int64_t step, const std::string& my_failure) {
  const std::vector<std::string> failures = gather_failures(my_failure);
  memory::FallbackRung* rung = ladder_.next();
  if (rung == nullptr) throw fallbacks_spent(step, failures);
  ++fallbacks_;
  // A captured graph holds the old micro-batch's shapes (and the model as it was): capture anew.
  graphs_->invalidate(fmt::format("fallback {}", rung->name()));
  const std::string change = rung->take();
  if (control_.rank() == 0)
    spdlog::warn("{}", memory::taken_message(step, failures, *rung, change));
}

memory::OutOfMemoryFatal Trainer::fallbacks_spent(int64_t step,
                                                  const std::vector<std::string>& failures) {
  std::string where = "no checkpoint written (checkpoint.dir is not set)";
  if (!options_.checkpoint.dir.empty()) {
    // The steps before this one are complete; resuming from it re-runs this step.
    const std::string path =
        fmt::format("{}/oom_step_{:06d}.safetensors", options_.checkpoint.dir, step);
    // checkpoint.format: sharded writes the directory of that name, without ".safetensors".
    where = "checkpoint written to " + save_checkpoint(path, /*steps_done=*/step - 1);
    finish_checkpoint();  // the job ends: written before the error
  }
  // Accumulation keeps the global batch whatever the micro-batch: only a smaller micro-batch,
  // model or footprint helps, never a smaller global batch.
  const std::string advice =
      micro_batch_ > 1
          ? fmt::format("Let the micro-batch shrink further (memory.min_micro_batch = {}, "
                        "memory.fallback), use a smaller model, or give each rank more memory.",
                        options_.memory.min_micro_batch)
          : "Even one sample per micro-batch does not fit: use a smaller model or give each rank "
            "more memory.";
  // Sharding the optimizer state frees 2P(1 - 1/W) per rank for activations.
  const std::string shard_advice =
      shard_ == ddp::ShardMode::kNone && control_.size() > 1
          ? " Or shard the optimizer state: ddp.shard: optimizer, or the rung shard_optimizer in "
            "memory.fallback."
          : "";
  return memory::OutOfMemoryFatal(fmt::format(
      "out of memory at step {} with every fallback spent (memory.fallback = [{}], micro-batch "
      "{}):\n  {}\n{}. {}",
      step, fmt::join(memory::to_strings(options_.memory.fallback), ", "), micro_batch_,
      fmt::join(failures, "\n  "), where, advice + shard_advice));
}

void Trainer::shard_optimizer_in_place() {
  // Every rank holds the same replicated moments: each slices out its own blocks, with no
  // collective, before the full moments go, and only then do the buckets and parameters change.
  // The order keeps the extra memory to this rank's blocks (the full moments are freed first).
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> m = reducer_->blocks_of(optimizer_->exp_avgs());
    std::vector<at::Tensor> v = reducer_->blocks_of(optimizer_->exp_avg_sqs());
    const int64_t steps = optimizer_->steps();
    const at::Tensor count = optimizer_->step_count().clone();
    optimizer_.reset();
    clipper_.reset();
    reducer_->shard_in_place(ddp::ShardMode::kOptimizer);
    optimizer_ = make_sharded_optimizer();
    for (size_t b = 0; b < m.size(); ++b) {
      optimizer_->exp_avgs()[b].copy_(m[b]);
      optimizer_->exp_avg_sqs()[b].copy_(v[b]);
    }
    optimizer_->set_steps(steps);
    optimizer_->step_count().copy_(count);
    make_clipper(/*sharded=*/true);
  } catch (const c10::OutOfMemoryError& e) {
    // After the vote: the other ranks are switching too, and this rank cannot follow.
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory switching to ddp.shard: optimizer (memory.fallback rung "
        "shard_optimizer): {}",
        control_.rank(), first_line(e.what_without_backtrace())));
  }
  shard_ = ddp::ShardMode::kOptimizer;
  estimate_.gradients = reducer_->gradient_bytes();
  estimate_.optimizer_state = optimizer_->state_bytes();
}

std::string Trainer::shard_parameters() {
  const ddp::ShardMode before = shard_;
  const int64_t bytes = estimate_.parameters + estimate_.gradients + estimate_.optimizer_state;
  shard_parameters_in_place();
  return fmt::format(
      "now ddp.shard: parameters (was {}), each rank keeps its 1/{} of the parameters, gradients "
      "and AdamW moments and gathers the model unit by unit (parameters, gradients and optimizer "
      "state {} -> {} per rank); micro-batch {} unchanged",
      ddp::to_string(before), control_.size(), mib(bytes),
      mib(estimate_.parameters + estimate_.gradients + estimate_.optimizer_state),
      plan_.micro_batch);
}

void Trainer::shard_parameters_in_place() {
  // Every rank holds the same parameters; the moments are full on every rank (replicated, or
  // gathered from the blocks: collective), sliced into the new blocks, then the full ones go.
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> m = reducer_->sharded() ? reducer_->unshard(optimizer_->exp_avgs(), -1)
                                                    : optimizer_->exp_avgs();
    std::vector<at::Tensor> v = reducer_->sharded()
                                    ? reducer_->unshard(optimizer_->exp_avg_sqs(), -1)
                                    : optimizer_->exp_avg_sqs();
    const int64_t steps = optimizer_->steps();
    const at::Tensor count = optimizer_->step_count().clone();
    optimizer_.reset();
    clipper_.reset();
    reducer_.reset();
    for (auto& p : model_->parameters()) p.mutable_grad() = at::Tensor();
    shard_ = ddp::ShardMode::kParameters;
    allocate_gradients();  // the Reducer over the units (its check is collective), the optimizer
    m = reducer_->blocks_of(m);
    v = reducer_->blocks_of(v);
    for (size_t b = 0; b < m.size(); ++b) {
      optimizer_->exp_avgs()[b].copy_(m[b]);
      optimizer_->exp_avg_sqs()[b].copy_(v[b]);
    }
    optimizer_->set_steps(steps);
    optimizer_->step_count().copy_(count);
  } catch (const c10::OutOfMemoryError& e) {
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory switching to ddp.shard: parameters (memory.fallback rung "
        "shard_parameters): {}",
        control_.rank(), first_line(e.what_without_backtrace())));
  }
  // The parameters are the same on every rank: no broadcast before each keeps its blocks.
  shard_parameters_after_broadcast();
  plan_ = make_plan(micro_batch_);  // the same number of micro-batches on every rank
  estimate_.gradients = reducer_->gradient_bytes();
  estimate_.optimizer_state = optimizer_->state_bytes();
}

void Trainer::compare_estimate(int64_t step) {
  // Peak since the start table (reset there), the largest over ranks, against the largest plan.
  at::Tensor v = at::tensor({static_cast<double>(memory::sample_memory(device_).tensor_peak_bytes),
                             static_cast<double>(estimate_.peak(plan_.micro_batch))},
                            at::kDouble);
  control_.all_reduce(v, ddp::ReduceOp::kMax, "memory estimate check");
  const double measured = v.data_ptr<double>()[0];  // host tensors (control plane)
  const double estimated = v.data_ptr<double>()[1];
  if (control_.rank() == 0 && measured > 0) {
    spdlog::info("memory after step {}: estimated peak {:.1f} MiB, measured {:.1f} MiB ({:+.0f}%)",
                 step, estimated / 1048576.0, measured / 1048576.0,
                 100.0 * (estimated - measured) / measured);
  }
}

void Trainer::report_memory(const std::string& title) {
  const auto mine = memory::sample_memory(device_).to_vector();
  at::Tensor all = at::empty({control_.size() * memory::MemorySample::kFields}, at::kDouble);
  control_.all_gather(all, at::tensor(mine, at::kDouble), "memory table");
  memory::reset_peaks(device_);
  if (control_.rank() != 0) return;
  std::vector<memory::MemorySample> samples;
  const double* v = all.data_ptr<double>();
  for (int r = 0; r < control_.size(); ++r) {
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
