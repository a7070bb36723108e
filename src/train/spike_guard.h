// SpikeGuard: train.skip_spikes, the loss-spike guard. A step whose global loss or gradient norm
// is more than z standard deviations above the mean of the last `window` applied steps is not
// applied (llm.c's -sl / -sg, as z-scores over a moving window), and neither is a step whose loss
// is inf or NaN.
//
// The verdict is made on the device from values every rank holds alike, so every rank skips the
// same steps with no collective and no host read of its own (Note [No host synchronisation in
// the step], train/trainer.cpp):
// - the gradient norm is GradClipper::norm(), the same on every rank;
// - the global loss (the SUM over ranks of each rank's weighted loss) rides in a collective the
//   step already makes: the first gradient bucket's all-reduce (ddp::Reducer::rider()) when
//   gradients are replicated, the gradient norm's all-reduce (GradClipper::rider()) when they are
//   sharded; with one rank it is the rank's own loss.
// The window holds the applied steps only: a skipped step's values never enter it, so a run of
// spikes stays a run of spikes. Until the window is full (the first `window` applied steps of a
// run, and again after a resume: the window is not checkpointed) no step is judged a spike; a
// non-finite loss is rejected from the first step. With a standard deviation of exactly 0 no
// value is an outlier. The skip itself goes through LossScaler (reject_spike), the one verdict the
// optimizer kernel reads; it is counted with the non-finite skips (train.max_skipped_steps).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "train/options.h"

namespace train {

class SpikeGuard {
 public:
  // Allocates the window and scratch on `device` (persistent state, before step 1).
  SpikeGuard(SpikeGuardOptions options, c10::Device device);

  // The step's spike verdict into spike(): `loss` is the global loss (float [1]), `norm` the
  // global gradient norm before clipping (float 0-dim). Queues device work only.
  void judge(const at::Tensor& loss, const at::Tensor& norm);
  // float [1]: 1 where the last judge() found a spike (or a non-finite loss), else 0.
  const at::Tensor& spike() const { return spike_; }
  // After the step's verdict is final (`skip`: float [1], 1 for a skipped step): an applied
  // step's loss and norm enter the window. Queues device work only.
  void record(const at::Tensor& skip);

  // The values judged, in this order wherever they sit side by side (this step's values, the
  // window's rows, the thresholds, write_state's slots); the last enumerator is their number.
  enum Judged : int64_t { kLoss, kGradNorm, kJudgedValues };
  // What write_state keeps of each judged value, in this order.
  enum Stat : int64_t { kStepValue, kWindowMean, kWindowStd, kStats };
  static constexpr int64_t kStateSlots = int64_t{kJudgedValues} * kStats;
  // Where write_state puts `stat` of `value`.
  static constexpr int64_t state_slot(Judged value, Stat stat) {
    return int64_t{value} * kStats + stat;
  }
  // For the last spike, each judged value's kStats numbers: the value, its window's mean and
  // standard deviation (float64, kStateSlots values into `out` on the device, at state_slot;
  // zeros before the first spike). Queues device work only.
  void write_state(at::Tensor out) const;

  const SpikeGuardOptions& options() const { return options_; }

 private:
  SpikeGuardOptions options_;
  at::Tensor window_;   // float64 [kJudgedValues, window]: the judged values of applied steps
  at::Tensor filled_;   // float64 [1]: applied steps in the window (at most `window`)
  at::Tensor next_;     // int64 [1]: the slot the next applied step overwrites
  at::Tensor slots_;    // int64 [window]: 0 .. window - 1
  at::Tensor at_next_;  // bool [window]: scratch
  at::Tensor values_;   // float64 [kJudgedValues]: this step's loss and norm
  at::Tensor mean_;     // float64 [kJudgedValues]
  at::Tensor std_;      // float64 [kJudgedValues]
  at::Tensor z_;        // float64 [kJudgedValues]: the thresholds (0 where a value is not judged)
  at::Tensor judged_;   // bool [kJudgedValues]: which values are judged
  at::Tensor over_;     // bool [kJudgedValues]: scratch
  at::Tensor spike_;    // float [1]
  // float64 [kStateSlots]: this step's values, means and deviations (at state_slot).
  at::Tensor stats_;
  at::Tensor last_spike_;  // float64 [kStateSlots]: stats_ of the last spike
};

// train.inject_spike: "STEP[; STEP ...]" (steps from 1): the loss of that step is multiplied by
// kInjectedSpike on every rank, before backward (a test hook, like train.inject_nonfinite).
// Throws std::invalid_argument for a malformed entry.
std::vector<int64_t> parse_spike_injections(const std::string& text);
inline constexpr double kInjectedSpike = 1000.0;

}  // namespace train
