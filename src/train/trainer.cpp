#include "train/trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error_text.h"
#include "memory/allocator_guard.h"
#include "memory/oom.h"
#include "models/capabilities.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/schedule.h"
#include "train/step_rng.h"

namespace train {

// Note [No host synchronisation in the step]
// A training step queues device work and never waits for it: the loss accumulates into a device
// tensor, the gradient norm and the clip factor are computed on the device (GradClipper), and
// the inf/NaN verdict (fp16's check of the gradients, and in every precision the check of the
// norm) goes straight from the loss scaler to the optimizer kernel, which skips the update itself
// (FusedAdamW::step). The status vote carries host values only (stop requests,
// out-of-memory failures) over the MPI control plane. On logged steps read_metrics() copies
// everything the log needs in one read (host_reads() counts them; the host-sync test holds
// non-logged steps to zero; train/step_metrics.h). What still waits for the device, and why:
// - NCCL bucket all-reduces: Work::wait() polls the all-reduce's completion event on the host, so
//   the deadline (ddp.timeout_s) is enforced by the waiting thread itself (ddp/nccl_communicator).
//   With one rank there is nothing to reduce and nothing is posted (ddp::Reducer).
// - Evaluation steps (train.eval_every), checkpoint steps (rank 0 copies the tensors out) and
//   the start-up (parameter checks, the memory probe) read the device; they are not training
//   steps.
// - An out-of-memory error is itself a synchronisation point (the allocator raised it).

namespace {

// Note [Step numbers]
// A step is numbered from 1 wherever a user or a log sees it: step lines, warnings, checkpoints'
// step counts, the profiler's range, memory.inject_oom and train.inject_nonfinite. The data
// layer's batch positions, the learning-rate schedule and the per-step RNG count from 0, and
// this is the one place that converts.
int64_t batch_index(int64_t step) { return step - 1; }

// The allocations that follow belong to `step`'s `next` phase (the OOM message, memory.inject_oom).
// On CUDA, allocations bypass the CPU allocator: injections are checked at phase starts.
void enter(memory::Phase& phase, memory::Phase next, int64_t step, bool cuda) {
  phase = next;
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_phase(step, next);
  if (cuda) guard.check_injection(0);
}

}  // namespace

StepResult Trainer::step(int64_t step, bool stop_requested, bool read_metrics) {
  if (step < 1) throw std::invalid_argument(fmt::format("Trainer::step: step {} (from 1)", step));
  ddp::Communicator& control = placement_.control;
  control.set_step(step);
  placement_.data.set_step(step);
  {
    const StepPhase in_rng("step/rng");
    seed_step_generators(options_.train.seed, batch_index(step), control.rank(), placement_.device);
  }
  StepResult r;
  r.step = step;
  for (;; ++r.attempts) {
    {
      const StepPhase in_zero_grad("step/zero_grad");
      state_.reducer().zero_grad();
    }
    const Attempt attempt = forward_backward(step);
    // Status vote: one small all-reduce of host values every step (stop requests, failures); the
    // control plane's tensors live on the host, so reading them synchronises with no device.
    at::Tensor vote =
        at::tensor({stop_requested ? 1.0 : 0.0, attempt.failure.empty() ? 0.0 : 1.0}, at::kDouble);
    {
      const StepPhase in_vote("step/vote");
      control.all_reduce(vote, ddp::ReduceOp::kSum, "status vote");
    }
    const double* votes = vote.data_ptr<double>();
    r.stop = votes[0] > 0;
    if (votes[1] == 0) break;
    fallbacks_->fall_back(step, attempt.failure, *graphs_);
  }
  update(step, r);
  if (read_metrics) this->read_metrics(r);
  return r;
}

std::string Trainer::why_not_graphed(int64_t step) const {
  const ddp::ShardMode mode = state_.shard_mode();
  return models::checkpoints_activations(*model_)
             ? "activation checkpointing is on (it saves and restores the RNG state on the host)"
         : injections_.nonfinite_at(placement_.rank(), step)
             ? "train.inject_nonfinite changes this step"
         : injections_.spike_at(step) ? "train.inject_spike changes this step"
         : mode == ddp::ShardMode::kGradients
             ? "ddp.shard: gradients allocates the gradient buckets anew every step"
         : mode == ddp::ShardMode::kParameters
             ? "ddp.shard: parameters gathers and frees the parameters in the step"
         : objective_.preference()
             ? fmt::format("train.objective: {} scores whole sequences", objective_.name())
         : batches_.packed()
             ? "the batches are packed documents (data.packing: documents), whose starts the "
               "model finds on the host"
             : "";
}

Trainer::Attempt Trainer::forward_backward(int64_t step) {
  Attempt attempt;
  memory::Phase phase = memory::Phase::kNone;
  ddp::Reducer& reducer = state_.reducer();
  passes_ = {};
  try {
    metrics_.zero();
    const bool graphed = graphs_->use_for_step(why_not_graphed(step));
    run_micro_batches(step, graphed, phase);
    const StepPhase in_reduce("step/reduce");
    if (graphed) {
      reducer.reduce_accumulated();
    } else {
      reducer.finish();
    }
    // The same reduced buckets, the same verdict, on every rank (sharded: each rank's blocks; the
    // verdicts are combined after the vote, in update()).
    scaler_->unscale(reducer.reduced_gradients());
  } catch (const c10::OutOfMemoryError& e) {
    memory::CpuAllocatorGuard::instance().set_phase(step, memory::Phase::kNone);
    attempt.failure = fmt::format("rank {} in {} (micro-batch {}): {}", placement_.rank(),
                                  memory::to_string(phase), batches_.plan().micro_batch,
                                  core::first_line(e.what_without_backtrace()));
    // ddp.shard: parameters: the other ranks go on gathering units and reduce-scattering their
    // gradients; this rank issues the same collectives without computing (Note [A failed pass],
    // unit_gate.cpp) so that every rank reaches the vote.
    if (state_.gate() != nullptr) finish_passes_after_failure(attempt.failure);
    // The step's tensors are gone with the scope above; the buckets not posted yet still are.
    reducer.abandon();
  }
  return attempt;
}

void Trainer::finish_passes_after_failure(const std::string& failure) {
  UnitGatherer& gate = *state_.gate();
  ddp::Reducer& reducer = state_.reducer();
  const size_t micros = batches_.plan().micro_sizes.size();
  try {
    // The micro-batch under way: its pass completed, or run whole when it had not begun.
    if (passes_.begun > passes_.done) {
      if (gate.in_pass()) {
        gate.complete_failed_pass();
      } else {
        gate.dry_pass();
      }
    }
    for (size_t m = passes_.begun; m < micros; ++m) {
      reducer.begin_micro_batch(/*sync=*/m + 1 == micros);
      gate.dry_pass();
    }
  } catch (const c10::OutOfMemoryError& e) {
    throw memory::OutOfMemoryAbort(fmt::format(
        "{}; then out of memory again while this rank issued the rest of the step's unit gathers "
        "without computing ({}), so the step cannot be voted on and the job ends here: use a "
        "smaller train.micro_batch_size, model.checkpoint_activations, or more memory per rank",
        failure, core::first_line(e.what_without_backtrace())));
  }
}

void Trainer::run_micro_batches(int64_t step, bool graphed, memory::Phase& phase) {
  std::optional<StepPhase> in_data(std::in_place, "step/data");
  const int64_t index = batch_index(step);
  const data::Batch batch = batches_.get(index);  // read ahead by the loader
  const bool inject = injections_.nonfinite_at(placement_.rank(), step);
  const double spike = injections_.spike_at(step) ? kInjectedSpike : 1.0;
  const ddp::BatchPlan& plan = batches_.plan();
  const size_t micros = plan.micro_sizes.size();
  // Micro-batch m + 1 is copied to the device while micro-batch m computes.
  data::Batch next = batches_.micro_batch(batch, 0, plan.micro_sizes[0]);
  in_data.reset();
  int64_t offset = 0;
  for (size_t m = 0; m < micros; ++m) {
    const int64_t n = plan.micro_sizes[m];
    const data::Batch micro = std::move(next);
    if (m + 1 < micros) next = batches_.micro_batch(batch, offset + n, plan.micro_sizes[m + 1]);
    // Only the last micro-batch's backward communicates (earlier ones accumulate: no_sync);
    // under a CUDA graph none does, and every bucket is reduced after the last replay.
    state_.reducer().begin_micro_batch(/*sync=*/!graphed && m + 1 == micros);
    ++passes_.begun;
    // Weighted by its share of the global batch's targets: the SUM over ranks is the loss per
    // target of the global batch (docs/DESIGN.md, "Global batch semantics").
    micro_batch_forward_backward(step, micro, batches_.weight(index, offset, n) * spike, graphed,
                                 inject && m + 1 == micros, phase);
    offset += n;
  }
}

void Trainer::micro_batch_forward_backward(int64_t step, const data::Batch& micro, double weight,
                                           bool graphed, bool inject, memory::Phase& phase) {
  const bool cuda = placement_.device.is_cuda();
  enter(phase, memory::Phase::kForward, step, cuda);
  const at::Tensor& rider = state_.loss_rider();
  // Everything one micro-batch does on the device: what a CUDA graph captures (never a packed
  // micro-batch: why_not_graphed).
  const GraphStep::Body body = [&](const at::Tensor& inputs, const at::Tensor& targets) {
    at::Tensor loss;
    {
      const StepPhase in_forward("step/forward");
      AutocastScope autocast(placement_.device, options_.train.precision);  // not backward
      // The objective's metrics, per pair of the global batch (weight: this micro-batch's pairs
      // over the global batch's).
      const double per_sample = weight / static_cast<double>(inputs.size(0));
      loss = objective_.loss({inputs, targets, micro.positions, micro.pairs},
                             metrics_.objective().defined() ? &metrics_.objective() : nullptr,
                             per_sample) *
             weight;
    }
    metrics_.loss().add_(loss.detach());  // stays on the device (read_metrics)
    // The global loss rides in a collective of this step (posted from backward): ModelState.
    rider.copy_(metrics_.loss());
    // fp16: backward of the scaled loss (the reduced gradients are unscaled after finish()).
    at::Tensor to_backward = scaler_->enabled() ? loss * scaler_->scale() : loss;
    if (inject) to_backward = to_backward * std::numeric_limits<float>::infinity();
    enter(phase, memory::Phase::kBackward, step, cuda);
    const StepPhase in_backward("step/backward");
    to_backward.backward();
  };
  UnitGatherer* gate = state_.gate();
  if (graphed) {
    graphs_->run(micro.inputs, micro.targets, body);
    enter(phase, memory::Phase::kBackward, step, cuda);  // injections, as in an eager backward
  } else if (gate != nullptr) {
    // ddp.shard: parameters: one pass of the gate per micro-batch; a model without units is one
    // unit, gathered for the whole forward and backward.
    // An exception leaves the pass open: finish_passes_after_failure completes it.
    gate->begin_pass();
    if (!state_.model_has_units()) gate->enter(0);
    body(micro.inputs, micro.targets);
    gate->end_pass();
    ++passes_.done;
  } else {
    body(micro.inputs, micro.targets);
  }
  enter(phase, memory::Phase::kNone, step, cuda);
}

void Trainer::update(int64_t step, StepResult& r) {
  const auto& t = options_.train;
  const double factor = schedule_.factor(batch_index(step));
  r.lr = t.lr * factor;
  // Sharded: each rank checked its blocks only; one verdict for all (a device all-reduce, after
  // the vote, so that every rank posts it, including one that ran out of memory before unscaling).
  if (state_.reducer().sharded()) scaler_->combine_verdict(placement_.data);
  // After the vote nothing can be retried: the update changes the parameters. It allocates
  // nothing by design (train/optimizer.h); if it still runs out, this rank ends the job.
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_phase(step, memory::Phase::kOptimizer);
  try {
    guard.check_injection(0);
    clip_and_step(step, factor);
    const StepPhase in_gather("step/gather");
    state_.reducer().gather_parameters();  // sharded: every rank updated its blocks only
  } catch (const c10::OutOfMemoryError& e) {
    guard.set_phase(step, memory::Phase::kNone);
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory in the optimizer step of step {}: {}. The step allocates "
        "nothing (its state is allocated before step 1), so something else took this rank's "
        "memory; its parameters may be half updated, so the job ends here.",
        placement_.rank(), step, core::first_line(e.what_without_backtrace())));
  }
  guard.set_phase(step, memory::Phase::kNone);
}

void Trainer::clip_and_step(int64_t step, double factor) {
  GradClipper& clipper = state_.clipper();
  {
    const StepPhase in_clip("step/clip");
    clipper.clip(options_.train.grad_clip);
  }
  // Every precision: a non-finite norm (the same on every rank) joins fp16's verdict; fp16 backs
  // off or grows the scale; a step with the verdict set is counted and the optimizers skip their
  // update, on the device (LossScaler, FusedAdamW::step, Muon::step).
  const StepPhase in_optimizer("step/optimizer");
  scaler_->reject_nonfinite(clipper.norm());
  if (guard_ != nullptr) {  // train.skip_spikes: the global loss and norm, alike everywhere
    guard_->judge(state_.loss_rider(), clipper.norm());
    scaler_->reject_spike(guard_->spike());
  }
  scaler_->update(step);
  if (guard_ != nullptr) guard_->record(scaler_->skip());
  state_.step(factor, scaler_->skip());
}

bool Trainer::Injections::spike_at(int64_t step) const {
  return std::find(spikes.begin(), spikes.end(), step) != spikes.end();
}

bool Trainer::Injections::nonfinite_at(int rank, int64_t step) const {
  for (const auto& [r, at_step] : nonfinite) {
    if (r == rank && at_step == step) return true;
  }
  return false;
}

void Trainer::read_metrics(StepResult& r) {
  metrics_.read(r, placement_.control, state_.clipper(), *scaler_, guard_.get(),
                options_.train.max_skipped_steps);
}

}  // namespace train
