// RunReport: what a run tells its user on logged steps and evaluations: rank 0's step line (loss,
// lr, grad norm, loss scale, samples/s, tokens/s and MFU, data wait, RSS, ETA), its progress bar
// (progress.h), the records of the metrics file (metrics.h) and the scalars of the TensorBoard
// event file (tensorboard.h). The Trainer decides when; this decides what and how. It knows the
// loop only through the values it is handed (results.h, RunFacts): reporting sits below train/
// and never includes it (docs/DESIGN.md, "Layers").
//
// Collective: step() gathers every rank's memory peak when a metrics file or TensorBoard files are
// written (the configuration says so, so every rank knows); every rank calls step() and eval() on
// the same steps, and tick() after every step.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/communicator.h"
#include "train/report/metrics.h"
#include "train/report/progress.h"
#include "train/report/results.h"
#include "train/report/tensorboard.h"

namespace train {

// The log section's say in the report (train::LogOptions, resolved by the Trainer).
struct ReportOptions {
  ProgressSetting progress{};  // log.progress: auto | bar | lines | off (progress_mode)
  std::string metrics_path;    // the metrics file (metrics_path()); "": none
  std::string tensorboard;     // log.tensorboard: the event files' directory; "": none
};

struct RunFacts {
  int64_t steps = 0;  // train.steps
  int64_t global_batch = 0;
  int world_size = 1;
  int64_t steps_per_epoch = 1;
  int64_t positions = 0;       // tokens per sample (token data), else 0
  double flops_per_token = 0;  // the model's estimate for `positions` (0: none)
  double peak_tflops = 0;      // the device's dense peak at the run's precision (0: unknown)
};

class RunReport {
 public:
  // Opens the metrics file on rank 0 (dropping records after `start_step`, a resumed run's).
  RunReport(ddp::Communicator& control, const ReportOptions& options, c10::Device device,
            RunFacts facts, int64_t start_step);

  // " N tokens/s MFU M%" for token data (MFU where the device's peak is known); "" otherwise.
  std::string throughput(double samples_per_s) const;

  // A logged step: `window_steps` steps took `elapsed_s`, of which `data_wait_s` waiting for data.
  void step(int64_t step, const StepResult& r, int64_t window_steps, double elapsed_s,
            double data_wait_s, int64_t micro_batch, int fallbacks, int64_t skipped_steps);
  // An evaluation's record (its line was logged by evaluate_and_log).
  void eval(int64_t step, const ValidationMetrics& m);
  // Step `step` (1-based) finished, logged or not: rank 0's progress bar and ETA (log.progress)
  // move on. Reads nothing from the device.
  void tick(int64_t step) { progress_.tick(step); }

 private:
  ddp::Communicator& control_;
  c10::Device device_;
  RunFacts facts_;
  MetricsFile metrics_;
  bool metrics_on_ = false;  // the same on every rank (from the configuration)
  Progress progress_;        // off on ranks other than 0
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0, with log.tensorboard
  bool tensorboard_on_ = false;  // the same on every rank (from the configuration)
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The run's last line (rank 0 logs it): "done: N steps[ (M in this run)], loss A -> B, X samples/s
// [tokens/s MFU] in training (evaluation 1.2 s, ..., checkpoints 0.3 s apart), K memory
// fallback(s)", one entry per bucket of summary.aside (none: no parenthesis). `start_step`: the
// steps done before this run (a resumed run's checkpoint).
std::string done_line(const RunSummary& summary, int64_t start_step);

}  // namespace train
