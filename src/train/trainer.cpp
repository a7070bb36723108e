#include "train/trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <limits>

#include "memory/allocator_guard.h"
#include "models/capabilities.h"
#include "memory/memory_stats.h"
#include "memory/oom.h"
#include "train/checkpoint.h"
#include "train/error_text.h"
#include "train/evaluation.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/report/metrics.h"
#include "train/report/run_report.h"
#include "train/schedule.h"

namespace train {

// Note [No host synchronisation in the step]
// A training step queues device work and never waits for it: the loss accumulates into a device
// tensor, the gradient norm and the clip factor are computed on the device (GradClipper), and
// fp16's inf/NaN verdict goes straight from the loss scaler to the optimizer kernel, which skips
// the update itself (FusedAdamW::step). The status vote carries host values only (stop requests,
// out-of-memory failures) over the MPI control plane. On logged steps read_metrics() copies
// everything the log needs in one read (host_reads() counts them; the host-sync test holds
// non-logged steps to zero). What still waits for the device, and why:
// - NCCL bucket all-reduces: Work::wait() polls the all-reduce's completion event on the host, so
//   the deadline (ddp.timeout_s) is enforced by the waiting thread itself (ddp/nccl_communicator).
//   With one rank there is nothing to reduce and nothing is posted (ddp::Reducer).
// - Evaluation steps (train.eval_every), checkpoint steps (rank 0 copies the tensors out) and
//   the start-up (parameter checks, the memory probe) read the device; they are not training
//   steps.
// - An out-of-memory error is itself a synchronisation point (the allocator raised it).

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

Trainer::Trainer(const TrainerOptions& options, ddp::Communicator& control,
                 ddp::Communicator& data, std::shared_ptr<models::Model> model,
                 const data::Dataset& dataset, c10::Device device)
    : options_(options), control_(control), data_(data), model_(std::move(model)),
      dataset_(dataset), device_(device), precision_(options.train.precision),
      shard_(options.ddp.shard),
      micro_batch_(initial_micro_batch(options.train, control.size())),
      plan_(ddp::BatchPlan::make(options.train.global_batch_size, control.size(), control.rank(),
                                 options.train.micro_batch_size)),
      sampler_(dataset.size(), options.train.global_batch_size, options.train.seed),
      ladder_({}, micro_batch_, options.memory.min_micro_batch, /*has_cache=*/false) {
  // Persistent memory is allocated before step 1 (docs/DESIGN.md, "The OOM protocol"), so a step
  // can only run out of activation memory. Local allocations come first and are voted on before the
  // first collective that needs them: a rank that runs out here must not leave the others waiting
  // in a collective it never joins. Before them, the plan: does the state fit at all?
  check_state_fits();
  allocate_agreed("parameters, embedding caches and optimizer state", [&] {
    // Move by device only: Module::to(dtype) would also cast integer buffers (item texts).
    model_->to(device_);
    // Before the Reducer makes the gradients views with the parameters' strides.
    const Switch cl = options_.train.channels_last;
    if (cl == Switch::kOn || (cl == Switch::kAuto && device_.is_cuda())) {
      auto* channels_last = models::as<models::ChannelsLast>(*model_);
      if (channels_last != nullptr) channels_last->set_channels_last(true);
      const bool applied = channels_last != nullptr;
      if (control_.rank() == 0 && applied) {
        spdlog::info("channels-last (NHWC) convolution weights and activations (train.channels_last "
                     "= {})", kSwitchNames.at(static_cast<size_t>(cl)));
      } else if (control_.rank() == 0 && cl == Switch::kOn) {
        spdlog::warn("train.channels_last = on: this model does not convolve; ignored");
      }
    }
    auto state_bytes = [&] {
      int64_t bytes = 0;
      for (const auto& p : model_->parameters()) bytes += p.nbytes();
      for (const auto& b : model_->buffers()) bytes += b.nbytes();
      return bytes;
    };
    estimate_.parameters = state_bytes();
    if (auto* cache = models::as<models::EmbeddingCache>(*model_)) cache->build_cache();
    estimate_.caches = state_bytes() - estimate_.parameters;
    estimate_.other = std::max<int64_t>(
        0, memory::sample_memory(device_).tensor_bytes - estimate_.parameters - estimate_.caches);
    params_ = model_->parameters();
    const auto& t = options_.train;
    // Sharded, the optimizer runs over the Reducer's blocks: it is made with the Reducer below.
    if (shard_ == ddp::ShardMode::kNone) {
      optimizer_ = std::make_unique<FusedAdamW>(
          params_, AdamWHyper{t.beta1, t.beta2, t.eps, t.weight_decay});
      estimate_.optimizer_state = optimizer_->state_bytes();
    }
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
    step_loss_ = at::zeros({}, f64);
    metrics_slots_ = at::zeros({2 + LossScaler::kStateSlots}, f64);
    scaler_ = std::make_unique<LossScaler>(
        LossScalerOptions{precision_ == Precision::kFp16, t.loss_scale, t.loss_scale_growth,
                          t.loss_scale_backoff, t.loss_scale_interval},
        device_);
  });
  nonfinite_injections_ = parse_nonfinite_injections(options_.train.inject_nonfinite);
  ddp::NamedParameters named;
  for (auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  const auto& d = options_.ddp;
  allocate_agreed("gradient buckets", [&] {
    // The Reducer checks the parameter lists (collective, before this rank can fail) and then
    // only allocates.
    reducer_ = std::make_unique<ddp::Reducer>(
        std::move(named), data_,
        ddp::ReducerOptions{static_cast<int64_t>(d.first_bucket_mb * (1 << 20)),
                            static_cast<int64_t>(d.bucket_mb * (1 << 20)), d.find_unused_parameters,
                            reduce_wire_dtype(), shard_},
        &control_);
    const bool sharded = reducer_->sharded();
    if (sharded) {
      optimizer_ = make_sharded_optimizer();
      estimate_.optimizer_state = optimizer_->state_bytes();
    }
    clipper_ = std::make_unique<GradClipper>(reducer_->reduced_gradients(),
                                             sharded ? &data_ : nullptr);
  });
  estimate_.gradients += reducer_->gradient_bytes();
  // Last, so that it measures activations with everything persistent already in place.
  allocate_agreed("the loader's buffers and the activation probe", [&] { probe_activations(); });
  broadcast_model();
  choose_micro_batch();
  // A model that can checkpoint activations (and does not already) offers that rung.
  const bool can_checkpoint = models::as<models::ActivationCheckpointing>(*model_) != nullptr &&
                              !models::checkpoints_activations(*model_);
  ladder_ = memory::FallbackLadder(options_.memory.fallback, micro_batch_,
                                   options_.memory.min_micro_batch, models::has_cache(*model_),
                                   can_checkpoint,
                                   /*can_shard=*/!reducer_->sharded() && control_.size() > 1);
  // The loader reads this rank's slice of each step; the slice (offset, size) never changes with
  // the micro-batch, so a fallback keeps reading the same samples.
  data::LoaderOptions loader = options_.loader;
  loader.pin_memory = device_.is_cuda();
  const int64_t offset = plan_.offset, per_rank = plan_.per_rank;
  loader_ = std::make_unique<data::Loader>(
      dataset_, [this, offset, per_rank](int64_t step) { return sampler_.indices(step, offset, per_rank); },
      loader);
  // Eager warm-up steps before the first capture: lazy initialisation, cuDNN autotuning, and
  // the allocator's steady state.
  constexpr int64_t kGraphWarmupSteps = 3;
  graphs_ = std::make_unique<GraphStep>(options_.train.cuda_graphs, device_, kGraphWarmupSteps,
                                        control_.rank() == 0);
}

c10::ScalarType Trainer::reduce_wire_dtype() const {
  return options_.ddp.reduce_dtype == ddp::ReduceDtype::kBf16 ? at::kBFloat16
                                                              : c10::ScalarType::Undefined;
}

std::unique_ptr<FusedAdamW> Trainer::make_sharded_optimizer() const {
  const auto& t = options_.train;
  return std::make_unique<FusedAdamW>(reducer_->parameter_shards(),
                                      AdamWHyper{t.beta1, t.beta2, t.eps, t.weight_decay},
                                      reducer_->reduced_gradients());
}

void Trainer::broadcast_model() {
  at::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) {
    data_.broadcast(item.value().data(), 0, "parameter " + item.key());
  }
  for (auto& item : model_->named_buffers()) data_.broadcast(item.value(), 0, "buffer " + item.key());
}

Trainer::Attempt Trainer::forward_backward(int64_t step) {
  auto& guard = memory::CpuAllocatorGuard::instance();
  // On CUDA, allocations bypass the CPU allocator: injections are checked at phase starts.
  auto enter = [&](memory::Phase phase) {
    guard.set_phase(step + 1, phase);  // step numbers users see (logs, inject_oom) start at 1
    if (device_.is_cuda()) guard.check_injection(0);
  };
  Attempt attempt;
  memory::Phase phase = memory::Phase::kNone;
  try {
    std::optional<StepPhase> in_data(std::in_place, "step/data");
    const data::Batch batch = loader_->get(step);  // read ahead by the loader's workers
    step_loss_.zero_();
    const bool inject = injects_nonfinite(step);
    const bool graphed = graphs_->use_for_step(
        models::checkpoints_activations(*model_)
            ? "activation checkpointing is on (it saves and restores the RNG state on the host)"
        : inject ? "train.inject_nonfinite changes this step"
        : shard_ == ddp::ShardMode::kGradients
            ? "ddp.shard: gradients allocates the gradient buckets anew every step"
            : "");
    const size_t micros = plan_.micro_sizes.size();
    // Micro-batch m + 1 is copied to the device while micro-batch m computes.
    data::Batch next = data::to_device(batch, 0, plan_.micro_sizes[0], device_);
    in_data.reset();
    int64_t offset = 0;
    for (size_t m = 0; m < micros; ++m) {
      const int64_t n = plan_.micro_sizes[m];
      const data::Batch micro = std::move(next);
      if (m + 1 < micros) next = data::to_device(batch, offset + n, plan_.micro_sizes[m + 1], device_);
      // Only the last micro-batch's backward communicates (earlier ones accumulate: no_sync);
      // under a CUDA graph none does, and every bucket is reduced after the last replay.
      reducer_->begin_micro_batch(/*sync=*/!graphed && m + 1 == micros);
      enter(phase = memory::Phase::kForward);
      // Weighted by its share of the global batch: the SUM over ranks is the global mean.
      const double weight = plan_.weight(n);
      const bool inject_here = inject && m + 1 == micros;
      // Everything one micro-batch does on the device: what a CUDA graph captures.
      const GraphStep::Body body = [&](const at::Tensor& inputs, const at::Tensor& targets) {
        at::Tensor loss;
        {
          const StepPhase in_forward("step/forward");
          AutocastScope autocast(device_, precision_);  // forward and loss only, not backward
          loss = model_->loss(inputs, targets) * weight;
        }
        // fp16: backward of the scaled loss (the reduced gradients are unscaled after finish()).
        at::Tensor to_backward = scaler_->enabled() ? loss * scaler_->scale() : loss;
        if (inject_here) to_backward = to_backward * std::numeric_limits<float>::infinity();
        enter(phase = memory::Phase::kBackward);
        const StepPhase in_backward("step/backward");
        to_backward.backward();
        step_loss_.add_(loss.detach());  // stays on the device (read_metrics)
      };
      if (graphed) {
        graphs_->run(micro.inputs, micro.targets, body);
        enter(phase = memory::Phase::kBackward);  // injections, as in an eager backward
      } else {
        body(micro.inputs, micro.targets);
      }
      enter(phase = memory::Phase::kNone);
      offset += n;
    }
    const StepPhase in_reduce("step/reduce");
    if (graphed) {
      reducer_->reduce_accumulated();
    } else {
      reducer_->finish();
    }
    // The same reduced buckets, the same verdict, on every rank (sharded: each rank's blocks; the
    // verdicts are combined after the vote, in step()).
    scaler_->unscale(reducer_->reduced_gradients());
  } catch (const c10::OutOfMemoryError& e) {
    guard.set_phase(step + 1, memory::Phase::kNone);
    attempt.failure = fmt::format("rank {} in {} (micro-batch {}): {}", control_.rank(),
                                  memory::to_string(phase), plan_.micro_batch,
                                  first_line(e.what_without_backtrace()));
    // The step's tensors are gone with the scope above; the buckets not posted yet still are.
    reducer_->abandon();
  }
  return attempt;
}

bool Trainer::injects_nonfinite(int64_t step) const {
  for (const auto& [rank, at_step] : nonfinite_injections_) {
    if (rank == control_.rank() && at_step == step + 1) return true;
  }
  return false;
}

StepResult Trainer::step(int64_t step, bool stop_requested, bool read_metrics) {
  control_.set_step(step + 1);
  data_.set_step(step + 1);
  {
    const StepPhase in_rng("step/rng");
    seed_step_generators(options_.train.seed, step, control_.rank(), device_);  // train/step_rng.h
  }
  current_step_ = step + 1;
  StepResult r;
  for (;; ++r.attempts) {
    {
      const StepPhase in_zero_grad("step/zero_grad");
      reducer_->zero_grad();
    }
    const Attempt attempt = forward_backward(step);
    // Status vote: one small all-reduce of host values every step (stop requests, failures); the
    // control plane's tensors live on the host, so reading them synchronises with no device.
    at::Tensor vote = at::tensor({stop_requested ? 1.0 : 0.0, attempt.failure.empty() ? 0.0 : 1.0},
                                 at::kDouble);
    {
      const StepPhase in_vote("step/vote");
      control_.all_reduce(vote, ddp::ReduceOp::kSum, "status vote");
    }
    const double* votes = vote.data_ptr<double>();
    r.stop = votes[0] > 0;
    if (votes[1] == 0) break;
    fall_back(step, attempt.failure);
  }
  const auto& t = options_.train;
  r.lr = learning_rate(step, t.steps, t.warmup_steps, t.lr, t.min_lr_ratio);
  // Sharded: each rank checked its blocks only; one verdict for all (a device all-reduce, after
  // the vote, so that every rank posts it, including one that ran out of memory before unscaling).
  if (reducer_->sharded()) scaler_->combine_verdict(data_);
  // fp16: back off or grow the scale; a non-finite verdict (the same on every rank) makes the
  // optimizer kernel skip the update, on the device (LossScaler, FusedAdamW::step).
  scaler_->update();
  // After the vote nothing can be retried: the update changes the parameters. It allocates
  // nothing by design (train/optimizer.h); if it still runs out, this rank ends the job.
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_phase(step + 1, memory::Phase::kOptimizer);
  try {
    guard.check_injection(0);
    {
      const StepPhase in_clip("step/clip");
      clipper_->clip(t.grad_clip);
    }
    {
      const StepPhase in_optimizer("step/optimizer");
      optimizer_->step(r.lr, scaler_->enabled() ? &scaler_->found_inf() : nullptr);
    }
    const StepPhase in_gather("step/gather");
    reducer_->gather_parameters();  // sharded: every rank updated its blocks only
  } catch (const c10::OutOfMemoryError& e) {
    guard.set_phase(step + 1, memory::Phase::kNone);
    throw memory::OutOfMemoryAbort(fmt::format(
        "rank {} ran out of memory in the optimizer step of step {}: {}. The step allocates "
        "nothing (its state is allocated before step 1), so something else took this rank's "
        "memory; its parameters may be half updated, so the job ends here.",
        control_.rank(), step + 1, first_line(e.what_without_backtrace())));
  }
  guard.set_phase(step + 1, memory::Phase::kNone);
  if (read_metrics) this->read_metrics(r);
  return r;
}

void Trainer::read_metrics(StepResult& r) {
  // The one device-to-host read of a logged step: everything the log needs, copied at once.
  at::NoGradGuard no_grad;
  metrics_slots_.narrow(0, 0, 1).copy_(step_loss_.view({1}));
  metrics_slots_.narrow(0, 1, 1).copy_(clipper_->norm().view({1}));
  if (scaler_->enabled()) scaler_->write_state(metrics_slots_.narrow(0, 2, LossScaler::kStateSlots));
  const at::Tensor host = metrics_slots_.to(at::kCPU);
  ++host_reads_;
  const double* v = host.data_ptr<double>();
  at::Tensor loss = at::tensor({v[0]}, at::kDouble);
  control_.all_reduce(loss, ddp::ReduceOp::kSum, "loss");
  r.loss = loss.data_ptr<double>()[0];
  r.grad_norm = v[1];
  r.metrics_read = true;
  const int64_t since = last_read_step_;
  last_read_step_ = current_step_;
  if (!scaler_->enabled()) return;
  r.skipped = v[2] > 0;
  r.loss_scale = v[3];
  const auto longest_run = static_cast<int64_t>(v[4]);
  const auto total = static_cast<int64_t>(v[5]);
  const int64_t new_skips = total - skipped_total_;
  skipped_total_ = total;
  const auto& t = options_.train;
  if (new_skips > 0 && control_.rank() == 0) {
    if (new_skips == 1 && r.skipped) {
      spdlog::warn("step {}: non-finite gradient (inf or NaN) on some rank: step skipped on every "
                   "rank, parameters unchanged; loss scale now {:g}", current_step_, r.loss_scale);
    } else {
      spdlog::warn("steps {}-{}: {} step(s) had a non-finite gradient (inf or NaN) on some rank and "
                   "were skipped on every rank, parameters unchanged; loss scale now {:g}",
                   since + 1, current_step_, new_skips, r.loss_scale);
    }
  }
  if (longest_run >= t.max_skipped_steps) {
    throw NonFiniteFatal(fmt::format(
        "{} steps in a row (seen at step {}) had non-finite gradients; the loss scale is now {:g} "
        "(train.max_skipped_steps = {}): the model diverged or overflows fp16. Lower train.lr, "
        "or train with train.precision: bf16 or fp32.",
        longest_run, current_step_, r.loss_scale, t.max_skipped_steps));
  }
}

RunSummary Trainer::run(const std::function<bool()>& stop_requested) {
  RunSummary summary;
  const auto& t = options_.train;
  const int64_t start = start_step_;
  summary.steps_done = start;
  if (start >= t.steps) {
    spdlog::info("the checkpoint has {} steps done, train.steps = {}: nothing to train", start, t.steps);
    return summary;
  }
  spdlog::info("training {} steps{}, global batch {} on {} rank(s); rank {}: {}", t.steps,
               start > 0 ? fmt::format(" from step {}", start + 1) : "", plan_.global_batch,
               plan_.world_size, plan_.rank, plan_.describe());
  report_memory(fmt::format("memory before step {}: parameters, buckets, optimizer state, caches",
                            start + 1));
  RunFacts facts;
  facts.steps = t.steps;
  facts.global_batch = plan_.global_batch;
  facts.world_size = plan_.world_size;
  facts.steps_per_epoch = sampler_.steps_per_epoch();
  facts.positions = dataset_.shape().context;
  facts.flops_per_token = model_->flops_per_token(facts.positions);
  facts.peak_tflops = peak_tflops(device_, precision_, tf32_enabled(), t.peak_tflops);
  const ReportOptions report_options{
      options_.log.progress, metrics_path(options_.log.metrics, options_.checkpoint.dir),
      options_.log.tensorboard};
  RunReport report(control_, report_options, device_, facts, start);
  auto window_start = Clock::now();
  auto steady_start = Clock::now();
  int64_t window_steps = 0;
  double waited_before = 0;  // the loader's wait at the start of the log window
  // Time spent outside the training steps (evaluation, samples, memory tables, checkpoints): kept
  // apart, so that step lines and the "done:" line report training throughput.
  double aside_s = 0, aside_in_window_s = 0, aside_steady_s = 0;
  const auto aside = [&](double* total, auto&& work) {
    const auto t0 = Clock::now();
    work();
    const double took = seconds_since(t0);
    *total += took;
    aside_s += took;
    aside_in_window_s += took;
  };
  StepProfiler profiler(options_.log.profile, options_.log.profile_from, options_.log.profile_steps,
                        control_.rank(), device_.is_cuda());
  for (int64_t s = start; s < t.steps; ++s) {
    // Logged steps read the step's numbers from the device; the others read nothing (a step that
    // turns out to be the agreed last one, after a signal, reads them below).
    const bool logged = s == start || (s + 1) % options_.log.every == 0 || s + 1 == t.steps;
    profiler.before_step(s + 1);
    StepResult r = step(s, stop_requested && stop_requested(), logged);
    if (r.stop && !r.metrics_read) read_metrics(r);
    profiler.after_step(s + 1);
    ++window_steps;
    report.tick(s + 1);
    summary.steps_done = s + 1;
    if (s == start) {
      summary.first_loss = r.loss;  // the first step is always logged
      steady_start = Clock::now();
      aside_steady_s = aside_s;
    }
    const bool last = s + 1 == t.steps || r.stop;
    if (last) summary.last_loss = r.loss;
    if (r.metrics_read) {
      report.step(s + 1, r, window_steps, seconds_since(window_start) - aside_in_window_s,
                  loader_->waited_s() - waited_before, plan_.micro_batch, fallbacks_,
                  skipped_total_);
      waited_before = loader_->waited_s();
      window_start = Clock::now();
      window_steps = 0;
      aside_in_window_s = 0;
    }
    if (s + 1 == std::min<int64_t>(start + 3, t.steps)) compare_estimate(s + 1);
    const int64_t every = options_.memory.check_every;
    if ((every > 0 && (s + 1) % every == 0) || last) {
      aside(&summary.evaluation_s, [&] {
        report_memory(fmt::format("memory at step {} (peak since the last table)", s + 1));
      });
    }
    if ((t.eval_every > 0 && (s + 1) % t.eval_every == 0) || last) {
      // Collective (one all-reduce) for datasets with a validation split or held-out items.
      aside(&summary.evaluation_s, [&] {
        report.eval(s + 1, evaluate_and_log(control_, *model_, dataset_, s + 1,
                                            plan_.micro_batch, t.eval_samples));
      });
    }
    if (text_sampler_ && t.sample_every > 0 && (s + 1) % t.sample_every == 0) {
      aside(&summary.evaluation_s,
            [&] { spdlog::info("sample at step {}: {}", s + 1, text_sampler_()); });
    }
    const auto& ckpt = options_.checkpoint;
    if (!ckpt.dir.empty() && ckpt.every > 0 && (s + 1) % ckpt.every == 0) {
      aside(&summary.checkpoint_s, [&] {
        save_checkpoint(fmt::format("{}/step_{:06d}.safetensors", ckpt.dir, s + 1), s + 1);
      });
    }
    if (r.stop) {
      if (control_.rank() == 0) spdlog::warn("stop requested (signal): stopping after step {}", s + 1);
      summary.stopped = true;
      break;
    }
  }
  profiler.finish();
  if (summary.steps_done - start > 1) {
    summary.samples_per_s = (summary.steps_done - start - 1) * plan_.global_batch /
                            (seconds_since(steady_start) - (aside_s - aside_steady_s));
    summary.throughput = report.throughput(summary.samples_per_s);
  }
  summary.fallbacks = fallbacks_;
  if (!options_.checkpoint.dir.empty()) {
    aside(&summary.checkpoint_s, [&] {
      save_checkpoint(options_.checkpoint.dir + "/final.safetensors", summary.steps_done);
    });
  }
  return summary;
}

void Trainer::save_checkpoint(const std::string& path, int64_t steps_done) {
  // Sharded: the moments are gathered into full tensors on rank 0 (collective), so the file is
  // the one an unsharded run writes and resumes on any world size, sharded or not.
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs;
  if (reducer_->sharded()) {
    exp_avgs = reducer_->unshard(optimizer_->exp_avgs(), 0);
    exp_avg_sqs = reducer_->unshard(optimizer_->exp_avg_sqs(), 0);
  }
  if (control_.rank() != 0) return;
  write_checkpoint(path, *model_, reducer_->sharded() ? exp_avgs : optimizer_->exp_avgs(),
                   reducer_->sharded() ? exp_avg_sqs : optimizer_->exp_avg_sqs(),
                   {steps_done, options_.train.global_batch_size, options_.train.seed,
                    control_.size(), options_.config_text});
  spdlog::info("checkpoint written: {} ({} steps done)", path, steps_done);
  // Older periodic checkpoints go only once the new one is complete (renamed into place).
  for (const auto& old : prune_checkpoints(options_.checkpoint.dir, options_.checkpoint.keep_last)) {
    spdlog::info("checkpoint.keep_last = {}: deleted {}", options_.checkpoint.keep_last, old);
  }
}

void Trainer::resume(const Checkpoint* ckpt) {
  // Rank 0 read the file (and already holds its parameters, broadcast at construction).
  at::Tensor step = at::tensor({ckpt != nullptr ? ckpt->meta.step : int64_t{-1}}, at::kLong);
  control_.broadcast(step, 0, "resume step");
  const int64_t steps_done = step.item<int64_t>();
  if (steps_done < 0) return;
  at::NoGradGuard no_grad;
  if (reducer_->sharded()) {  // rank 0 holds full moments; each rank takes its blocks
    std::vector<at::Tensor> m, v;
    if (ckpt != nullptr) {
      for (const auto& item : model_->named_parameters()) {
        m.push_back(ckpt->tensors.at(exp_avg_key(item.key())));
        v.push_back(ckpt->tensors.at(exp_avg_sq_key(item.key())));
      }
    }
    reducer_->shard_from(ckpt != nullptr ? &m : nullptr, optimizer_->exp_avgs());
    reducer_->shard_from(ckpt != nullptr ? &v : nullptr, optimizer_->exp_avg_sqs());
    optimizer_->set_steps(steps_done);
    start_step_ = steps_done;
    return;
  }
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
  optimizer_->set_steps(steps_done);
  start_step_ = steps_done;
}

}  // namespace train
