// What the training loop produces and the reporting layer shows: one optimizer step's outcome, an
// evaluation's means and a run's summary. Plain values, in a header of their own below both the
// loop (train/trainer.h fills them) and the report (train/report/run_report.h reads them), so
// that reporting never includes the loop (docs/DESIGN.md, "Layers").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace train {

// One optimizer step's outcome. `stop` and `attempts` are known on the host at once; the numbers
// below them live on the device until Trainer::read_metrics() copies them out (logged steps only:
// Note [No host synchronisation in the step] in train/trainer.cpp).
struct StepResult {
  int64_t step = 0;   // the step's number, from 1 (as the log numbers it)
  bool stop = false;  // some rank asked to stop (a signal); all ranks agree
  int attempts = 1;   // 1 + the fallbacks this step needed
  double lr = 0;
  bool metrics_read = false;  // the fields below hold this step's values
  double loss = 0;            // mean loss over the global batch
  double grad_norm = 0;       // before clipping
  bool skipped = false;   // a non-finite gradient (norm) on some rank; no update (all ranks agree)
  double loss_scale = 0;  // fp16: the scale after this step (0 without loss scaling)
  // The objective's metrics over the global batch (train/objective.h: "rewards/chosen", ...;
  // empty for train.objective: lm).
  std::vector<std::pair<std::string, double>> objective;
};

// A multiple-choice task's exact counts (train/choice_evaluation.h), the same on every rank.
struct ChoiceCounts {
  std::string name;  // the task file's stem ("hellaswag")
  int64_t acc = 0;
  int64_t acc_norm = 0;
  int64_t examples = 0;
};

// An evaluation's named means over `samples` (validation samples, or users for ranking metrics),
// the same on every rank (train/evaluation.h); samples = 0: no validation was evaluated. `tasks`:
// the counts of each of eval.tasks.
struct ValidationMetrics {
  std::vector<std::pair<std::string, double>> means;
  int64_t samples = 0;
  std::vector<ChoiceCounts> tasks;
};

// Seconds spent per kind of periodic action ("evaluation", "checkpoints", ...), in the order the
// loop registered them (train/periodic.h).
using TimeBuckets = std::vector<std::pair<std::string, double>>;

// What TrainingLoop::run() did.
struct RunSummary {
  int64_t steps_done = 0;
  double first_loss = 0;
  double last_loss = 0;
  // Over the training steps after the first (which includes warm-up); the time spent between
  // steps on periodic actions (evaluation, samples, memory tables, checkpoints) is not counted in
  // it but in `aside`, per bucket.
  double samples_per_s = 0;
  TimeBuckets aside;
  std::string throughput;  // " N tokens/s MFU M%" for token models; empty otherwise
  bool stopped = false;
  int fallbacks = 0;
  int64_t skipped_steps = 0;  // not applied: non-finite, or spikes (train.skip_spikes)
};

}  // namespace train
