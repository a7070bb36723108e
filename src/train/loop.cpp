#include "train/loop.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "models/capabilities.h"
#include "train/fallbacks.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/report/metrics.h"
#include "train/step_metrics.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

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

std::unique_ptr<checkpoint::Checkpointer> make_checkpointer(Trainer& trainer,
                                                            std::string config_text) {
  const TrainerOptions& o = trainer.options();
  const Placement& where = trainer.placement();
  checkpoint::RunRecord record;
  record.global_batch_size = o.train.global_batch_size;
  record.seed = o.train.seed;
  record.config_text = std::move(config_text);
  record.configured_shard = trainer.configured_shard();
  if (const auto* frozen = models::as<models::FrozenBase>(trainer.model())) {
    record.base = frozen->base_path();  // LoRA: the base the adapters belong to
    record.base_hash = frozen->base_hash();
  }
  return std::make_unique<checkpoint::Checkpointer>(
      o.checkpoint, std::move(record),
      checkpoint::CheckpointComms{where.control, where.data, where.shard, where.replicas});
}

int64_t resume(checkpoint::Checkpointer& checkpointer, Trainer& trainer,
               const checkpoint::Checkpoint* ckpt) {
  const int64_t steps_done = checkpointer.resume(ckpt, trainer.run_state());
  if (steps_done > 0) trainer.set_steps_done(steps_done);
  return steps_done;
}

TrainingLoop::TrainingLoop(Trainer& trainer, checkpoint::Checkpointer& checkpointer,
                           EvalInputs eval, int64_t start_step)
    : trainer_(trainer), checkpointer_(checkpointer), eval_(std::move(eval)), start_(start_step) {}

TrainingLoop::~TrainingLoop() = default;

// The loop, top to bottom: one step, its record, the periodic actions due after it.
RunSummary TrainingLoop::run(const std::function<bool()>& stop_requested) {
  summary_.steps_done = start_;
  if (!begin()) return summary_;
  const int64_t steps = trainer_.options().train.steps;
  const auto& log = trainer_.options().log;
  StepProfiler profiler(log.profile, log.profile_from, log.profile_steps, trainer_.control().rank(),
                        trainer_.device().is_cuda());
  for (int64_t step = start_ + 1; step <= steps; ++step) {
    profiler.before_step(step);
    const StepResult r = train_step(step, stop_requested);
    profiler.after_step(step);
    const bool last = step == steps || r.stop;
    record(step, r, last);
    clock_->aside(actions_.run_due(step, last));  // the last step's: the final evaluation, ...
    if (last) break;
  }
  profiler.finish();
  return end();
}

bool TrainingLoop::begin() {
  const TrainerOptions& o = trainer_.options();
  if (start_ >= o.train.steps) {
    spdlog::info("the checkpoint has {} steps done, train.steps = {}: nothing to train", start_,
                 o.train.steps);
    return false;
  }
  const ddp::BatchPlan& plan = trainer_.plan();
  spdlog::info("training {} steps{}, global batch {} on {} rank(s); rank {}: {}", o.train.steps,
               start_ > 0 ? fmt::format(" from step {}", start_ + 1) : "", plan.global_batch,
               plan.world_size, plan.rank, plan.describe());
  trainer_.memory().report_memory(fmt::format(
      "memory before step {}: parameters, buckets, optimizer state, caches", start_ + 1));
  report_ = std::make_unique<RunReport>(
      trainer_.control(),
      ReportOptions{o.log.progress, metrics_path(o.log.metrics, o.checkpoint.dir),
                    o.log.tensorboard},
      trainer_.device(), facts(), start_);
  add_builtin_actions();
  for (PeriodicAction& action : extra_) actions_.add(std::move(action));
  add_checkpoint_actions();  // last: a checkpoint follows everything else due at its step
  clock_ = std::make_unique<TrainingClock>(trainer_.data_wait_s());
  return true;
}

StepResult TrainingLoop::train_step(int64_t step, const std::function<bool()>& stop_requested) {
  const auto& o = trainer_.options();
  // Logged steps read the step's numbers from the device; the others read nothing (a step that
  // turns out to be the agreed last one, after a signal, reads them below).
  const bool logged = step == start_ + 1 || step % o.log.every == 0 || step == o.train.steps;
  try {
    StepResult r = trainer_.step(step, stop_requested && stop_requested(), logged);
    if (r.stop && !r.metrics_read) trainer_.read_metrics(r);
    return r;
  } catch (const NonFiniteFatal& e) {  // every rank, at the same step
    // A skipped step changes nothing: the parameters and moments are the last applied step's.
    const std::string path = save_state_before_exit(fmt::format("step_{:06d}", step), step);
    if (path.empty()) {
      throw NonFiniteFatal(
          fmt::format("{} No checkpoint written (checkpoint.dir is not set).", e.what()));
    }
    throw NonFiniteFatal(fmt::format("{} The last good state (the skipped steps changed nothing) "
                                     "is in {}; resuming from it goes on after step {}, past the "
                                     "skipped batches.",
                                     e.what(), path, step));
  } catch (const FallbacksSpent& e) {  // every rank, after the same vote
    // The steps before this one are complete; resuming from it re-runs this step.
    const std::string path = save_state_before_exit(fmt::format("oom_step_{:06d}", step), step - 1);
    throw memory::OutOfMemoryFatal(
        e.with_checkpoint(path.empty() ? "no checkpoint written (checkpoint.dir is not set)"
                                       : "checkpoint written to " + path));
  }
}

std::string TrainingLoop::save_state_before_exit(const std::string& name, int64_t steps_done) {
  if (checkpointer_.options().dir.empty()) return "";
  const std::string path =
      checkpointer_.save(checkpointer_.path_of(name), steps_done, trainer_.run_state());
  checkpointer_.finish();  // the job ends: complete before the message names it
  return path;
}

void TrainingLoop::record(int64_t step, const StepResult& r, bool last) {
  clock_->step_done(step == start_ + 1);
  report_->tick(step);
  summary_.steps_done = step;
  if (step == start_ + 1) summary_.first_loss = r.loss;  // the first step is always logged
  if (last) {
    summary_.last_loss = r.loss;
    summary_.stopped = r.stop;
  }
  if (r.metrics_read) {
    report_->step(step, r, clock_->window_steps(), clock_->window_training_s(),
                  clock_->window_data_wait_s(trainer_.data_wait_s()), trainer_.plan().micro_batch,
                  trainer_.fallbacks(), trainer_.skipped_steps());
    clock_->new_window(trainer_.data_wait_s());
  }
  if (r.stop && trainer_.control().rank() == 0) {
    spdlog::warn("stop requested (signal): stopping after step {}", step);
  }
}

RunSummary TrainingLoop::end() {
  checkpointer_.finish();  // none pending after the final checkpoint; this covers the rest
  const int64_t steps = summary_.steps_done - start_;
  if (steps > 1) {
    summary_.samples_per_s = static_cast<double>((steps - 1) * trainer_.plan().global_batch) /
                             clock_->steady_training_s();
    summary_.throughput = report_->throughput(summary_.samples_per_s);
  }
  summary_.fallbacks = trainer_.fallbacks();
  summary_.skipped_steps = trainer_.skipped_steps();
  summary_.aside = actions_.buckets();
  return summary_;
}

RunFacts TrainingLoop::facts() const {
  const auto& t = trainer_.options().train;
  RunFacts facts;
  facts.steps = t.steps;
  facts.global_batch = trainer_.plan().global_batch;
  facts.world_size = trainer_.plan().world_size;
  facts.steps_per_epoch = trainer_.steps_per_epoch();
  facts.flops_per_token = trainer_.model().flops_per_token(trainer_.dataset().shape().context);
  // A preference pair is two rows of data.context positions.
  facts.positions =
      trainer_.dataset().shape().context * (trainer_.objective().preference() ? 2 : 1);
  facts.peak_tflops =
      peak_tflops(trainer_.device(), trainer_.precision(), tf32_enabled(), t.peak_tflops);
  return facts;
}

void TrainingLoop::add_builtin_actions() {
  const TrainerOptions& o = trainer_.options();
  Trainer& trainer = trainer_;
  // The plan's peak against the measured one, a few steps in (before the next table resets the
  // peaks).
  actions_.add({"memory estimate",
                "memory tables",
                {.once_at = std::min(start_ + 3, o.train.steps)},
                [&trainer](int64_t step) {
                  trainer.memory().compare_estimate(step, trainer.plan().micro_batch);
                }});
  actions_.add({"memory table",
                "memory tables",
                {.every = o.memory.check_every, .after_last = true},
                [&trainer](int64_t step) {
                  trainer.memory().report_memory(
                      fmt::format("memory at step {} (peak since the last table)", step));
                }});
  // Collective: one all-reduce for datasets with a validation split or held-out items, and one
  // per task of eval.tasks.
  actions_.add({"evaluation",
                "evaluation",
                {.every = o.train.eval_every, .after_last = true},
                [this, &trainer, &o](int64_t step) {
                  const auto units = trainer.units_in_step();  // ddp.shard: parameters
                  report_->eval(
                      step,
                      evaluate_and_log(trainer.control(), trainer.model(), trainer.dataset(), step,
                                       trainer.plan().micro_batch, o.train.eval_samples, eval_));
                  if (units) units->finish();
                }});
}

void TrainingLoop::add_checkpoint_actions() {
  const auto& c = checkpointer_.options();
  if (c.dir.empty()) return;
  actions_.add({"periodic checkpoint", "checkpoints", {.every = c.every}, [this](int64_t step) {
                  // A full disk is a warning here (checkpoint.max_failed_writes).
                  checkpointer_.save(checkpointer_.path_of(fmt::format("step_{:06d}", step)), step,
                                     trainer_.run_state(), checkpoint::Need::kMayFail);
                }});
  actions_.add({"final checkpoint", "checkpoints", {.after_last = true}, [this](int64_t step) {
                  checkpointer_.save(checkpointer_.path_of("final"), step, trainer_.run_state());
                  checkpointer_.finish();  // the run ends with every checkpoint complete
                }});
}

}  // namespace train
