// TrainingLoop: the run, above the step. Steps from the one after the checkpoint's to
// train.steps, the step lines, and between steps the periodic actions (train/periodic.h): the
// memory tables, evaluation, the caller's (rank 0's text samples), the periodic and final
// checkpoints. The step itself is Trainer::step (train/trainer.h); checkpoints are written by a
// checkpoint::Checkpointer from the Trainer's state. The launcher builds the loop over both.
//
// Collective, like the step: every rank runs the same steps and registers the same collective
// actions with the same cadences, so every rank issues the same collectives in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "train/evaluation.h"
#include "train/periodic.h"
#include "train/report/results.h"
#include "train/report/run_report.h"
#include "train/trainer.h"

namespace train {

class TrainingClock;

// The Checkpointer of `trainer`'s run: the checkpoint options, what every checkpoint records
// (`config_text`: the effective configuration) and the Trainer's communicators.
std::unique_ptr<checkpoint::Checkpointer> make_checkpointer(Trainer& trainer,
                                                            std::string config_text);
// Continues `trainer` from `ckpt` (rank 0's, whose parameters and buffers it applied to the model
// before the Trainer was built; nullptr on the other ranks and when there is none): AdamW's
// moments through `checkpointer`, and the step count. Returns the optimizer steps done (0: a
// fresh start). Collective.
int64_t resume(checkpoint::Checkpointer& checkpointer, Trainer& trainer,
               const checkpoint::Checkpoint* ckpt);

class TrainingLoop {
 public:
  // Runs `trainer` from `start_step` optimizer steps done (a resumed checkpoint's) to
  // train.steps; `eval`: what evaluation reads besides the dataset (eval.tasks, bits per byte),
  // the same on every rank.
  TrainingLoop(Trainer& trainer, checkpoint::Checkpointer& checkpointer, EvalInputs eval,
               int64_t start_step);
  ~TrainingLoop();

  // Registers an action run between steps, after the built-in ones (memory tables, evaluation)
  // due at the same step and before its checkpoints. A collective action must be added on every
  // rank with the same cadence; one that does not communicate (rank 0's text sample) may be
  // added on one rank.
  void add(PeriodicAction action) { extra_.push_back(std::move(action)); }

  // Runs the steps after the start up to train.steps; `stop_requested` is polled each step and
  // voted on by all ranks (the step after which some rank asked is the last).
  RunSummary run(const std::function<bool()>& stop_requested);

 private:
  // Before step 1 of this run: the plan's line, the memory table, the report, the actions.
  // False (with nothing registered) when the checkpoint has every step done.
  bool begin();
  // One step and, on logged steps, its numbers; the state a job-ending failure leaves is written
  // first (NonFiniteFatal: the last good state; FallbacksSpent: the steps before).
  StepResult train_step(int64_t step, const std::function<bool()>& stop_requested);
  // After a step: the summary, the step line of a logged step, the progress bar.
  void record(int64_t step, const StepResult& r, bool last);
  RunSummary end();

  // The built-in periodic actions, in the order they run after a step: the memory estimate and
  // tables, evaluation; then the caller's; then the checkpoints.
  void add_builtin_actions();
  void add_checkpoint_actions();
  RunFacts facts() const;
  // Writes (and finishes) a checkpoint NAME of the state as it is, with `steps_done` steps, when
  // checkpoint.dir is set; returns its path ("": none). Collective (every rank fails at the same
  // step).
  std::string save_state_before_exit(const std::string& name, int64_t steps_done);

  Trainer& trainer_;
  checkpoint::Checkpointer& checkpointer_;
  EvalInputs eval_;
  int64_t start_;
  std::vector<PeriodicAction> extra_;
  PeriodicActions actions_;
  std::unique_ptr<RunReport> report_;
  std::unique_ptr<TrainingClock> clock_;
  RunSummary summary_;
};

}  // namespace train
