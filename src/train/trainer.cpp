#include "train/trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>

#include "ddp/gather.h"
#include "memory/allocator_guard.h"
#include "memory/oom.h"
#include "models/capabilities.h"
#include "train/checkpoint.h"
#include "train/checkpoint_sharded.h"
#include "train/error_text.h"
#include "train/loop.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/schedule.h"

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

RunSummary Trainer::run(const std::function<bool()>& stop_requested) {
  return TrainingLoop(*this, periodic_).run(stop_requested);
}

void Trainer::set_sampler(std::function<std::string()> sample) {
  add_periodic({"text sample",
                "samples",
                {.every = options_.train.sample_every},
                [sample = std::move(sample)](int64_t step) {
                  spdlog::info("sample at step {}: {}", step, sample());
                }});
}

StepResult Trainer::step(int64_t step, bool stop_requested, bool read_metrics) {
  if (step < 1) throw std::invalid_argument(fmt::format("Trainer::step: step {} (from 1)", step));
  control_.set_step(step);
  data_.set_step(step);
  {
    const StepPhase in_rng("step/rng");
    seed_step_generators(options_.train.seed, batch_index(step), control_.rank(), device_);
  }
  StepResult r;
  r.step = step;
  for (;; ++r.attempts) {
    {
      const StepPhase in_zero_grad("step/zero_grad");
      reducer_->zero_grad();
    }
    const Attempt attempt = forward_backward(step);
    // Status vote: one small all-reduce of host values every step (stop requests, failures); the
    // control plane's tensors live on the host, so reading them synchronises with no device.
    at::Tensor vote =
        at::tensor({stop_requested ? 1.0 : 0.0, attempt.failure.empty() ? 0.0 : 1.0}, at::kDouble);
    {
      const StepPhase in_vote("step/vote");
      control_.all_reduce(vote, ddp::ReduceOp::kSum, "status vote");
    }
    const double* votes = vote.data_ptr<double>();
    r.stop = votes[0] > 0;
    if (votes[1] == 0) break;
    fall_back(step, attempt.failure);
  }
  update(step, r);
  if (read_metrics) this->read_metrics(r);
  return r;
}

Trainer::Attempt Trainer::forward_backward(int64_t step) {
  Attempt attempt;
  memory::Phase phase = memory::Phase::kNone;
  try {
    std::optional<StepPhase> in_data(std::in_place, "step/data");
    const data::Batch batch =
        loader_->get(batch_index(step));  // read ahead by the loader's workers
    metrics_.loss().zero_();
    const bool inject = injects_nonfinite(step);
    const bool spike = injects_spike(step);
    const bool graphed = graphs_->use_for_step(
        models::checkpoints_activations(*model_)
            ? "activation checkpointing is on (it saves and restores the RNG state on the host)"
        : inject ? "train.inject_nonfinite changes this step"
        : spike  ? "train.inject_spike changes this step"
        : shard_ == ddp::ShardMode::kGradients
            ? "ddp.shard: gradients allocates the gradient buckets anew every step"
        : shard_ == ddp::ShardMode::kParameters
            ? "ddp.shard: parameters gathers and frees the parameters in the step"
            : "");
    const size_t micros = plan_.micro_sizes.size();
    // Micro-batch m + 1 is copied to the device while micro-batch m computes.
    data::Batch next = micro_batch_data(batch, 0, plan_.micro_sizes[0]);
    in_data.reset();
    int64_t offset = 0;
    for (size_t m = 0; m < micros; ++m) {
      const int64_t n = plan_.micro_sizes[m];
      const data::Batch micro = std::move(next);
      if (m + 1 < micros) next = micro_batch_data(batch, offset + n, plan_.micro_sizes[m + 1]);
      // Only the last micro-batch's backward communicates (earlier ones accumulate: no_sync);
      // under a CUDA graph none does, and every bucket is reduced after the last replay.
      reducer_->begin_micro_batch(/*sync=*/!graphed && m + 1 == micros);
      // Weighted by its share of the global batch: the SUM over ranks is the global mean.
      micro_batch_forward_backward(step, micro, plan_.weight(n) * (spike ? kInjectedSpike : 1.0),
                                   graphed, inject && m + 1 == micros, phase);
      offset += n;
    }
    const StepPhase in_reduce("step/reduce");
    if (graphed) {
      reducer_->reduce_accumulated();
    } else {
      reducer_->finish();
    }
    // The same reduced buckets, the same verdict, on every rank (sharded: each rank's blocks; the
    // verdicts are combined after the vote, in update()).
    scaler_->unscale(reducer_->reduced_gradients());
  } catch (const c10::OutOfMemoryError& e) {
    memory::CpuAllocatorGuard::instance().set_phase(step, memory::Phase::kNone);
    attempt.failure =
        fmt::format("rank {} in {} (micro-batch {}): {}", control_.rank(), memory::to_string(phase),
                    plan_.micro_batch, first_line(e.what_without_backtrace()));
    // ddp.shard: parameters: the other ranks go on gathering units this rank no longer asks for,
    // so the step cannot be voted on and retried (not yet: replaying the rest of the gathers);
    // this rank ends the job (the launcher aborts every rank) instead of leaving it hanging.
    if (gate_ != nullptr) {
      throw memory::OutOfMemoryAbort(fmt::format(
          "out of memory inside a ddp.shard: parameters step ({}). Such a step cannot take a "
          "memory.fallback rung yet, so the job ends here: use a smaller train.micro_batch_size, "
          "model.checkpoint_activations, or more memory per rank",
          attempt.failure));
    }
    // The step's tensors are gone with the scope above; the buckets not posted yet still are.
    reducer_->abandon();
  }
  return attempt;
}

data::Batch Trainer::micro_batch_data(const data::Batch& batch, int64_t offset, int64_t n) const {
  // An empty micro-batch (BatchPlan::equalize_micro_batches) runs on the slice's last sample with
  // weight 0 (plan_.weight(0)): the same gathers as the other ranks' micro-batch, no gradient.
  if (n == 0) return data::to_device(batch, plan_.per_rank - 1, 1, device_);
  return data::to_device(batch, offset, n, device_);
}

void Trainer::micro_batch_forward_backward(int64_t step, const data::Batch& micro, double weight,
                                           bool graphed, bool inject, memory::Phase& phase) {
  const bool cuda = device_.is_cuda();
  enter(phase, memory::Phase::kForward, step, cuda);
  // Everything one micro-batch does on the device: what a CUDA graph captures.
  const GraphStep::Body body = [&](const at::Tensor& inputs, const at::Tensor& targets) {
    at::Tensor loss;
    {
      const StepPhase in_forward("step/forward");
      AutocastScope autocast(device_, precision_);  // forward and loss only, not backward
      loss = model_->loss(inputs, targets) * weight;
    }
    metrics_.loss().add_(loss.detach());  // stays on the device (read_metrics)
    // The spike guard's global loss rides in a collective of this step (posted from backward).
    if (loss_rider_.defined()) loss_rider_.copy_(metrics_.loss());
    // fp16: backward of the scaled loss (the reduced gradients are unscaled after finish()).
    at::Tensor to_backward = scaler_->enabled() ? loss * scaler_->scale() : loss;
    if (inject) to_backward = to_backward * std::numeric_limits<float>::infinity();
    enter(phase, memory::Phase::kBackward, step, cuda);
    const StepPhase in_backward("step/backward");
    to_backward.backward();
  };
  if (graphed) {
    graphs_->run(micro.inputs, micro.targets, body);
    enter(phase, memory::Phase::kBackward, step, cuda);  // injections, as in an eager backward
  } else if (gate_ != nullptr) {
    // ddp.shard: parameters: one pass of the gate per micro-batch; a model without units is one
    // unit, gathered for the whole forward and backward.
    gate_->begin_pass();
    struct EndPass {
      UnitGate& gate;
      ~EndPass() noexcept {
        try {
          gate.end_pass();
        } catch (...) {  // a failed collective already failed the step
        }
      }
    } end_pass{*gate_};
    if (!model_has_units_) gate_->enter(0);
    body(micro.inputs, micro.targets);
  } else {
    body(micro.inputs, micro.targets);
  }
  enter(phase, memory::Phase::kNone, step, cuda);
}

void Trainer::update(int64_t step, StepResult& r) {
  const auto& t = options_.train;
  r.lr = learning_rate(batch_index(step), t.steps, t.warmup_steps, t.lr, t.min_lr_ratio);
  // Sharded: each rank checked its blocks only; one verdict for all (a device all-reduce, after
  // the vote, so that every rank posts it, including one that ran out of memory before unscaling).
  if (reducer_->sharded()) scaler_->combine_verdict(data_);
  // After the vote nothing can be retried: the update changes the parameters. It allocates
  // nothing by design (train/optimizer.h); if it still runs out, this rank ends the job.
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_phase(step, memory::Phase::kOptimizer);
  try {
    guard.check_injection(0);
    {
      const StepPhase in_clip("step/clip");
      clipper_->clip(t.grad_clip);
    }
    {
      // Every precision: a non-finite norm (the same on every rank) joins fp16's verdict; fp16
      // backs off or grows the scale; a step with the verdict set is counted and the optimizer
      // kernel skips its update, on the device (LossScaler, FusedAdamW::step).
      const StepPhase in_optimizer("step/optimizer");
      scaler_->reject_nonfinite(clipper_->norm());
      if (guard_ != nullptr) {  // train.skip_spikes: the global loss and norm, alike everywhere
        guard_->judge(loss_rider_, clipper_->norm());
        scaler_->reject_spike(guard_->spike());
      }
      scaler_->update(step);
      if (guard_ != nullptr) guard_->record(scaler_->skip());
      optimizer_->step(r.lr, &scaler_->skip());
    }
    const StepPhase in_gather("step/gather");
    reducer_->gather_parameters();  // sharded: every rank updated its blocks only
  } catch (const c10::OutOfMemoryError& e) {
    guard.set_phase(step, memory::Phase::kNone);
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory in the optimizer step of step {}: {}. The step allocates "
        "nothing (its state is allocated before step 1), so something else took this rank's "
        "memory; its parameters may be half updated, so the job ends here.",
        control_.rank(), step, first_line(e.what_without_backtrace())));
  }
  guard.set_phase(step, memory::Phase::kNone);
}

bool Trainer::injects_spike(int64_t step) const {
  return std::find(spike_injections_.begin(), spike_injections_.end(), step) !=
         spike_injections_.end();
}

bool Trainer::injects_nonfinite(int64_t step) const {
  for (const auto& [rank, at_step] : nonfinite_injections_) {
    if (rank == control_.rank() && at_step == step) return true;
  }
  return false;
}

void Trainer::read_metrics(StepResult& r) {
  metrics_.read(r, control_, *clipper_, *scaler_, guard_.get(), options_.train.max_skipped_steps);
}

void Trainer::resume(const Checkpoint* ckpt) {
  // Rank 0 chose the checkpoint (and applied its parameters to the model before construction:
  // they were broadcast then). The step, and for an opened sharded checkpoint the length of its
  // path (-1: rank 0 holds whole tensors), go to every rank.
  const bool opened = ckpt != nullptr && ckpt->manifest.has_value();
  at::Tensor head = at::tensor({ckpt != nullptr ? ckpt->meta.step : int64_t{-1},
                                opened ? static_cast<int64_t>(ckpt->path.size()) : int64_t{-1}},
                               at::kLong);
  control_.broadcast(head, 0, "resume step");
  const int64_t steps_done = head[0].item<int64_t>();
  const int64_t path_length = head[1].item<int64_t>();
  if (steps_done < 0) return;
  at::NoGradGuard no_grad;
  if (path_length >= 0) {
    at::Tensor path = at::zeros({path_length}, at::kByte);
    if (opened) std::memcpy(path.data_ptr(), ckpt->path.data(), ckpt->path.size());
    control_.broadcast(path, 0, "resume path");
    read_own_moments(std::string(static_cast<const char*>(path.data_ptr()), path_length),
                     opened ? &*ckpt->manifest : nullptr);
  } else if (reducer_->sharded()) {  // rank 0 holds full moments; each rank takes its blocks
    std::vector<at::Tensor> m, v;
    if (ckpt != nullptr) {
      for (const auto& item : model_->named_parameters()) {
        m.push_back(ckpt->tensors.at(exp_avg_key(item.key())));
        v.push_back(ckpt->tensors.at(exp_avg_sq_key(item.key())));
      }
    }
    reducer_->shard_from(ckpt != nullptr ? &m : nullptr, optimizer_->exp_avgs());
    reducer_->shard_from(ckpt != nullptr ? &v : nullptr, optimizer_->exp_avg_sqs());
  } else {
    size_t i = 0;
    for (const auto& item : model_->named_parameters()) {
      const at::Tensor& m = optimizer_->exp_avgs()[i];
      const at::Tensor& v = optimizer_->exp_avg_sqs()[i];
      if (ckpt != nullptr) {
        m.copy_(ckpt->tensors.at(exp_avg_key(item.key())));
        v.copy_(ckpt->tensors.at(exp_avg_sq_key(item.key())));
      }
      data_.broadcast(m, 0, "AdamW state of " + item.key());
      data_.broadcast(v, 0, "AdamW state of " + item.key());
      ++i;
    }
  }
  optimizer_->set_steps(steps_done);
  start_step_ = steps_done;
}

void Trainer::read_own_moments(const std::string& step_dir, const io::ShardManifest* manifest) {
  std::string failure;
  std::exception_ptr mine;
  resume_bytes_read_ = 0;
  try {
    io::ShardManifest read;
    if (manifest == nullptr) {  // rank 0 verified the files; the others read the layout only
      try {
        read = io::read_manifest(step_dir);
      } catch (const io::ShardManifestError& e) {
        throw CheckpointDamaged(e.what());
      }
    }
    ShardedReader reader(step_dir, manifest != nullptr ? *manifest : std::move(read));
    if (reducer_->sharded()) {
      read_moment_blocks(reader);
    } else {
      // Unsharded, every rank keeps whole moments: each reads them itself, straight into its
      // optimizer state, rather than rank 0 reading and broadcasting them (no copy on rank 0).
      size_t i = 0;
      for (const auto& item : model_->named_parameters()) {
        reader.read_whole(exp_avg_key(item.key()), optimizer_->exp_avgs()[i]);
        reader.read_whole(exp_avg_sq_key(item.key()), optimizer_->exp_avg_sqs()[i]);
        ++i;
      }
    }
    resume_bytes_read_ = reader.bytes_read();
  } catch (const std::exception& e) {
    failure = first_line(e.what());
    mine = std::current_exception();
  }
  // Voted: a rank that cannot read its part must not leave the others waiting in a collective;
  // every rank fails, with the message naming the file.
  const auto failures = ddp::all_gather_strings(control_, failure);
  if (mine) std::rethrow_exception(mine);
  for (int r = 0; r < control_.size(); ++r) {
    if (!failures[r].empty()) {
      throw CheckpointError(
          fmt::format("rank {} could not read its part of {}: {}", r, step_dir, failures[r]));
    }
  }
}

void Trainer::read_moment_blocks(ShardedReader& reader) {
  const auto named = model_->named_parameters();
  const auto& layout = reducer_->layout();
  const auto shards = reducer_->shards();
  const std::vector<at::Tensor>* moments[] = {&optimizer_->exp_avgs(), &optimizer_->exp_avg_sqs()};
  std::string (*const keys[])(const std::string&) = {exp_avg_key, exp_avg_sq_key};
  for (size_t b = 0; b < layout.size(); ++b) {
    const ddp::BucketShard& shard = shards[b];
    for (size_t k = 0; k < 2; ++k) {
      const at::Tensor& block = (*moments[k])[b];
      // As Reducer::shard_from cuts it from whole tensors: zeros in the padding. A CPU block is
      // read in place; a device block through one host block at a time.
      const bool in_place = block.device().is_cpu() && block.is_contiguous();
      at::Tensor host =
          in_place ? block : at::empty({shard.size}, block.options().device(at::kCPU));
      host.zero_();
      for (size_t j = 0; j < layout[b].params.size(); ++j) {
        const at::Tensor& p = named[layout[b].params[j]].value();
        const int64_t offset = layout[b].offsets[j];
        const auto [first, last] = shard.owned(offset, p.numel());
        if (first >= last) continue;
        at::Tensor into = host.narrow(0, first - shard.begin, last - first);
        const std::string key = keys[k](named[layout[b].params[j]].key());
        if (reader.order(key) == element_order_of(p)) {
          reader.read(key, first - offset, into);  // the file's order is the bucket's
          continue;
        }
        // The bucket holds this parameter by its strides (say channels-last), the checkpoint in
        // another order (say row-major): read it whole and lay it out as the Reducer's view does.
        at::Tensor laid = at::empty({p.numel()}, host.options());
        reader.read_whole(key, laid.as_strided(p.sizes(), p.strides()));
        into.copy_(laid.narrow(0, first - offset, last - first));
      }
      if (!in_place) block.copy_(host);
    }
  }
}

}  // namespace train
