// TrainingLoop: Trainer::run(). Steps from the one after the checkpoint's to train.steps, the
// step lines, and between steps the periodic actions (train/periodic.h): the memory tables,
// evaluation, rank 0's text samples, the periodic and final checkpoints, and any action the
// caller registered (Trainer::add_periodic). The step itself is Trainer::step; the loop only
// calls it and times what runs beside it.
//
// Collective, like the step: every rank runs the same steps and registers the same collective
// actions with the same cadences, so every rank issues the same collectives in the same order.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "train/periodic.h"
#include "train/report/results.h"
#include "train/report/run_report.h"

namespace train {

class Trainer;

class TrainingLoop {
 public:
  // `extra`: actions registered by the caller; they run after the built-in ones of the same step
  // and before its checkpoints.
  TrainingLoop(Trainer& trainer, const std::vector<PeriodicAction>& extra);

  // Runs the steps after trainer.start_step() up to train.steps; `stop_requested` is polled each
  // step and voted on by all ranks (the step after which some rank asked is the last).
  RunSummary run(const std::function<bool()>& stop_requested);

 private:
  // The built-in periodic actions, in the order they run after a step: the memory estimate and
  // tables, evaluation; then the caller's (`extra`); then the checkpoints.
  void add_builtin_actions(RunReport& report);
  void add_checkpoint_actions();
  RunFacts facts() const;
  // train.max_skipped_steps ended the run at `step` (NonFiniteFatal: `why`): writes a checkpoint
  // of the state, which is the last applied step's, when checkpoint.dir is set, and returns the
  // message that says where. Collective (every rank throws at the same step).
  std::string save_last_good_state(int64_t step, const std::string& why);

  Trainer& trainer_;
  PeriodicActions actions_;
  const std::vector<PeriodicAction>& extra_;
};

}  // namespace train
