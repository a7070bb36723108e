// The Trainer's memory plan and out-of-memory protocol (docs/DESIGN.md, "The OOM protocol"): the
// agreed allocation of persistent state before step 1, the activation probe, the micro-batch
// that fits, the memory tables, and the fallback every rank takes after a failed vote. The
// training step itself is in trainer.cpp.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ddp/gather.h"
#include "memory/memory_stats.h"
#include "memory/oom.h"
#include "train/error_text.h"
#include "train/precision.h"
#include "train/trainer.h"

namespace train {

int64_t Trainer::initial_micro_batch(const TrainOptions& t, int world) {
  const int64_t largest_slice = (t.global_batch_size + world - 1) / world;
  return t.micro_batch_size > 0 ? std::min(t.micro_batch_size, largest_slice) : largest_slice;
}

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

void Trainer::probe_activations() {
  const data::Batch batch = dataset_.get(sampler_.indices(0, plan_.offset, plan_.per_rank));
  // The loader's buffers live in host memory: part of the peak on CPU only. (On a GPU the
  // micro-batch copied to the device is measured with the activations below.)
  if (device_.is_cpu()) {
    estimate_.loader = sampler_.buffer_bytes() +
                       data::Loader::buffer_bytes(options_.loader,
                                                  batch.inputs.nbytes() + batch.targets.nbytes());
  }
  // Backward accumulates into the bucket views, as in training; no_sync: nothing is reduced.
  reducer_->zero_grad();
  reducer_->begin_micro_batch(/*sync=*/false);
  // Two small micro-batches, halved while even they run out of memory (a large model on a small
  // device); a probe that cannot run one sample ends the start-up (allocate_agreed).
  for (int64_t b2 = std::min<int64_t>(plan_.per_rank, 16);; b2 /= 2) {
    const int64_t b1 = std::max<int64_t>(1, b2 / 2);
    const int64_t sizes[2] = {b1, b2};
    int64_t peaks[2] = {0, 0};
    try {
      for (int i = 0; i < (b2 > b1 ? 2 : 1); ++i) {
        memory::reset_peaks(device_);
        const int64_t base = memory::sample_memory(device_).tensor_bytes;
        {
          const auto inputs = batch.inputs.narrow(0, 0, sizes[i]).to(device_);
          const auto targets = batch.targets.narrow(0, 0, sizes[i]).to(device_);
          at::Tensor loss;
          {
            AutocastScope autocast(device_, precision_);  // as in training: it sets activations
            loss = model_->loss(inputs, targets);
          }
          loss.backward();
        }
        peaks[i] = memory::sample_memory(device_).tensor_peak_bytes - base;
      }
    } catch (const c10::OutOfMemoryError&) {
      if (b2 == 1) throw;
      continue;
    }
    memory::fit_activations(b1, peaks[0], b2, b2 > b1 ? peaks[1] : peaks[0], &estimate_);
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
    spdlog::warn("train.micro_batch_size auto: even a micro-batch of {} is estimated above "
                 "memory.target_fraction = {} of some rank's memory (rank 0: {:.1f} of {:.1f} MiB); "
                 "expect out-of-memory fallbacks",
                 micro_batch_, options_.memory.target_fraction,
                 estimate_.peak(micro_batch_) / 1048576.0, total / 1048576.0);
  }
  plan_ = ddp::BatchPlan::make(options_.train.global_batch_size, control_.size(), control_.rank(),
                               micro_batch_);
}

std::vector<std::string> Trainer::gather_failures(const std::string& mine) {
  std::vector<std::string> failures;
  for (auto& f : ddp::all_gather_strings(control_, mine)) {
    if (!f.empty()) failures.push_back(std::move(f));
  }
  return failures;
}

void Trainer::fall_back(int64_t step, const std::string& my_failure) {
  const std::vector<std::string> failures = gather_failures(my_failure);
  const auto action = ladder_.next();
  if (!action) {
    std::string where = "no checkpoint written (checkpoint.dir is not set)";
    if (!options_.checkpoint.dir.empty()) {
      // Steps before this one are complete; resuming from it re-runs this step.
      const std::string path =
          fmt::format("{}/oom_step_{:06d}.safetensors", options_.checkpoint.dir, step + 1);
      save_checkpoint(path, step);
      where = "checkpoint written to " + path;
    }
    // Accumulation keeps the global batch whatever the micro-batch: only a smaller micro-batch,
    // model or footprint helps, never a smaller global batch.
    const int64_t micro = ladder_.micro_batch();
    const std::string advice =
        micro > 1 ? fmt::format("Let the micro-batch shrink further (memory.min_micro_batch = {}, "
                                "memory.fallback), use a smaller model, or give each rank more "
                                "memory.", options_.memory.min_micro_batch)
                  : "Even one sample per micro-batch does not fit: use a smaller model or give "
                    "each rank more memory.";
    throw memory::OutOfMemoryFatal(fmt::format(
        "out of memory at step {} with every fallback spent (memory.fallback = [{}], micro-batch "
        "{}):\n  {}\n{}. {}",
        step + 1, fmt::join(memory::to_strings(options_.memory.fallback), ", "), micro, fmt::join(failures, "\n  "),
        where, advice));
  }
  ++fallbacks_;
  // A captured graph holds the old micro-batch's shapes (and the model as it was): capture anew.
  graphs_->invalidate(fmt::format("fallback {}", memory::to_string(action->rung)));
  const auto old_plan = plan_;
  if (action->rung == memory::Rung::kHalveMicroBatch) {
    micro_batch_ = action->new_micro_batch;
    plan_ = ddp::BatchPlan::make(options_.train.global_batch_size, control_.size(),
                                 control_.rank(), micro_batch_);
    if (control_.rank() == 0) spdlog::warn(
        "step {}: out of memory on {} rank(s): {}. Fallback {}: micro-batch {} -> {}, "
        "accumulation {} -> {} (rank 0); global batch {} unchanged; retrying the step.",
        step + 1, failures.size(), fmt::join(failures, "; "), memory::to_string(action->rung),
        old_plan.micro_batch, plan_.micro_batch, old_plan.accumulation(), plan_.accumulation(),
        plan_.global_batch);
  } else if (action->rung == memory::Rung::kCheckpointActivations) {
    model_->set_checkpoint_activations(true);
    if (control_.rank() == 0) {
      spdlog::warn("step {}: out of memory on {} rank(s): {}. Fallback {}: each block is now "
                   "recomputed in backward instead of keeping its activations; micro-batch {} "
                   "unchanged; retrying the step.",
                   step + 1, failures.size(), fmt::join(failures, "; "),
                   memory::to_string(action->rung), plan_.micro_batch);
    }
  } else {
    model_->uncache();
    if (control_.rank() == 0) {
      spdlog::warn("step {}: out of memory on {} rank(s): {}. Fallback {}: embedding caches "
                   "released, embeddings now computed per micro-batch; retrying the step.",
                   step + 1, failures.size(), fmt::join(failures, "; "),
                   memory::to_string(action->rung));
    }
  }
}

void Trainer::compare_estimate(int64_t step) {
  // Peak since the start table (reset there), the largest over ranks, against the largest plan.
  at::Tensor v = at::tensor({static_cast<double>(memory::sample_memory(device_).tensor_peak_bytes),
                             static_cast<double>(estimate_.peak(plan_.micro_batch))}, at::kDouble);
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
  std::string table = memory::format_memory_table(samples, title, options_.memory.high_watermark,
                                                  &warnings);
  table.pop_back();  // spdlog ends the line
  spdlog::info("{}", table);
  for (const auto& w : warnings) spdlog::warn("memory: {}", w);
}

}  // namespace train
