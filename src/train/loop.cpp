#include "train/loop.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "train/checkpoint.h"
#include "train/evaluation.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/report/metrics.h"
#include "train/trainer.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Wall time of the training steps alone: the periodic actions' seconds are taken out of the log
// window (the step lines' samples/s) and of the steady state after the first step (the `done:`
// line's samples/s).
class TrainingClock {
 public:
  explicit TrainingClock(double data_wait_s) : waited_before_(data_wait_s) {}
  void step_done(bool first) {
    ++window_steps_;
    if (!first) return;
    steady_start_ = Clock::now();  // the first step includes warm-up: not in the steady state
    aside_since_steady_ = 0;
  }
  void aside(double seconds) {
    aside_in_window_ += seconds;
    aside_since_steady_ += seconds;
  }
  int64_t window_steps() const { return window_steps_; }
  double window_training_s() const { return seconds_since(window_start_) - aside_in_window_; }
  double window_data_wait_s(double data_wait_s) const { return data_wait_s - waited_before_; }
  // A logged step closed the window; `data_wait_s`: the loader's wait so far.
  void new_window(double data_wait_s) {
    waited_before_ = data_wait_s;
    window_start_ = Clock::now();
    window_steps_ = 0;
    aside_in_window_ = 0;
  }
  double steady_training_s() const { return seconds_since(steady_start_) - aside_since_steady_; }

 private:
  Clock::time_point window_start_ = Clock::now();
  Clock::time_point steady_start_ = Clock::now();
  int64_t window_steps_ = 0;
  double waited_before_;  // the loader's wait at the start of the window
  double aside_in_window_ = 0;
  double aside_since_steady_ = 0;
};

}  // namespace

TrainingLoop::TrainingLoop(Trainer& trainer, const std::vector<PeriodicAction>& extra)
    : trainer_(trainer), extra_(extra) {}

RunFacts TrainingLoop::facts() const {
  const auto& t = trainer_.options().train;
  RunFacts facts;
  facts.steps = t.steps;
  facts.global_batch = trainer_.plan().global_batch;
  facts.world_size = trainer_.plan().world_size;
  facts.steps_per_epoch = trainer_.steps_per_epoch();
  facts.positions = trainer_.dataset().shape().context;
  facts.flops_per_token = trainer_.model().flops_per_token(facts.positions);
  facts.peak_tflops =
      peak_tflops(trainer_.device(), trainer_.precision(), tf32_enabled(), t.peak_tflops);
  return facts;
}

void TrainingLoop::add_builtin_actions(RunReport& report) {
  const TrainerOptions& o = trainer_.options();
  const int64_t start = trainer_.start_step();
  Trainer& trainer = trainer_;
  // The plan's peak against the measured one, a few steps in (before the next table resets the
  // peaks).
  actions_.add({"memory estimate",
                "memory tables",
                {.once_at = std::min(start + 3, o.train.steps)},
                [&trainer](int64_t step) { trainer.compare_estimate(step); }});
  actions_.add({"memory table",
                "memory tables",
                {.every = o.memory.check_every, .after_last = true},
                [&trainer](int64_t step) {
                  trainer.report_memory(
                      fmt::format("memory at step {} (peak since the last table)", step));
                }});
  // Collective: one all-reduce for datasets with a validation split or held-out items, and one
  // per task of eval.tasks.
  actions_.add({"evaluation",
                "evaluation",
                {.every = o.train.eval_every, .after_last = true},
                [&trainer, &report, &o](int64_t step) {
                  const auto pinned = trainer.pin_parameters();  // ddp.shard: parameters
                  report.eval(
                      step, evaluate_and_log(trainer.control(), trainer.model(), trainer.dataset(),
                                             step, trainer.plan().micro_batch, o.train.eval_samples,
                                             trainer.eval_inputs()));
                }});
}

void TrainingLoop::add_checkpoint_actions() {
  const TrainerOptions& o = trainer_.options();
  Trainer& trainer = trainer_;
  if (o.checkpoint.dir.empty()) return;
  actions_.add({"periodic checkpoint",
                "checkpoints",
                {.every = o.checkpoint.every},
                [&trainer, &o](int64_t step) {
                  trainer.save_checkpoint(
                      fmt::format("{}/step_{:06d}.safetensors", o.checkpoint.dir, step), step);
                }});
  actions_.add(
      {"final checkpoint", "checkpoints", {.after_last = true}, [&trainer, &o](int64_t step) {
         trainer.save_checkpoint(o.checkpoint.dir + "/final.safetensors", step);
         trainer.finish_checkpoint();  // the run ends with every checkpoint complete
       }});
}

std::string TrainingLoop::save_last_good_state(int64_t step, const std::string& why) {
  const std::string dir = trainer_.options().checkpoint.dir;
  if (dir.empty()) return why + " No checkpoint written (checkpoint.dir is not set).";
  // A skipped step changes nothing: the parameters and moments are the last applied step's.
  const std::string path =
      trainer_.save_checkpoint(fmt::format("{}/step_{:06d}.safetensors", dir, step), step);
  trainer_.finish_checkpoint();  // the job ends: complete before the message names it
  return fmt::format("{} The last good state (the skipped steps changed nothing) is in {}; "
                     "resuming from it goes on after step {}, past the skipped batches.",
                     why, path, step);
}

RunSummary TrainingLoop::run(const std::function<bool()>& stop_requested) {
  const TrainerOptions& o = trainer_.options();
  const auto& t = o.train;
  const int64_t start = trainer_.start_step();  // steps done before this run
  const int64_t first = start + 1;              // this run's first step
  RunSummary summary;
  summary.steps_done = start;
  if (start >= t.steps) {
    spdlog::info("the checkpoint has {} steps done, train.steps = {}: nothing to train", start,
                 t.steps);
    return summary;
  }
  const ddp::BatchPlan& plan = trainer_.plan();
  spdlog::info("training {} steps{}, global batch {} on {} rank(s); rank {}: {}", t.steps,
               start > 0 ? fmt::format(" from step {}", first) : "", plan.global_batch,
               plan.world_size, plan.rank, plan.describe());
  trainer_.report_memory(
      fmt::format("memory before step {}: parameters, buckets, optimizer state, caches", first));
  RunReport report(
      trainer_.control(),
      {o.log.progress, metrics_path(o.log.metrics, o.checkpoint.dir), o.log.tensorboard},
      trainer_.device(), facts(), start);
  add_builtin_actions(report);
  for (const PeriodicAction& action : extra_) actions_.add(action);
  add_checkpoint_actions();  // last: a checkpoint follows everything else due at its step
  TrainingClock clock(trainer_.data_wait_s());
  StepProfiler profiler(o.log.profile, o.log.profile_from, o.log.profile_steps,
                        trainer_.control().rank(), trainer_.device().is_cuda());
  for (int64_t step = first; step <= t.steps; ++step) {
    // Logged steps read the step's numbers from the device; the others read nothing (a step that
    // turns out to be the agreed last one, after a signal, reads them below).
    const bool logged = step == first || step % o.log.every == 0 || step == t.steps;
    profiler.before_step(step);
    StepResult r;
    try {
      r = trainer_.step(step, stop_requested && stop_requested(), logged);
      if (r.stop && !r.metrics_read) trainer_.read_metrics(r);
    } catch (const NonFiniteFatal& e) {  // every rank, at the same step
      throw NonFiniteFatal(save_last_good_state(step, e.what()));
    }
    profiler.after_step(step);
    clock.step_done(step == first);
    report.tick(step);
    summary.steps_done = step;
    if (step == first) summary.first_loss = r.loss;  // the first step is always logged
    const bool last = step == t.steps || r.stop;
    if (last) summary.last_loss = r.loss;
    if (r.metrics_read) {
      report.step(step, r, clock.window_steps(), clock.window_training_s(),
                  clock.window_data_wait_s(trainer_.data_wait_s()), trainer_.plan().micro_batch,
                  trainer_.fallbacks(), trainer_.skipped_steps());
      clock.new_window(trainer_.data_wait_s());
    }
    if (r.stop && trainer_.control().rank() == 0) {
      spdlog::warn("stop requested (signal): stopping after step {}", step);
    }
    clock.aside(actions_.run_due(step, last));  // the last step's: the final evaluation, ...
    if (last) {
      summary.stopped = r.stop;
      break;
    }
  }
  profiler.finish();
  trainer_.finish_checkpoint();  // none pending after the final checkpoint; this covers the rest
  if (summary.steps_done - start > 1) {
    summary.samples_per_s =
        static_cast<double>((summary.steps_done - start - 1) * plan.global_batch) /
        clock.steady_training_s();
    summary.throughput = report.throughput(summary.samples_per_s);
  }
  summary.fallbacks = trainer_.fallbacks();
  summary.skipped_steps = trainer_.skipped_steps();
  summary.aside = actions_.buckets();
  return summary;
}

}  // namespace train
