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

  // The last spike's loss, its window's mean and standard deviation, then the same three for the
  // gradient norm (float64, kStateSlots values into `out` on the device; zeros before the first
  // spike). Queues device work only.
  void write_state(at::Tensor out) const;
  static constexpr int64_t kStateSlots = 6;

  const SpikeGuardOptions& options() const { return options_; }

 private:
  SpikeGuardOptions options_;
  at::Tensor window_;   // float64 [2, window]: losses (row 0) and norms (row 1) of applied steps
  at::Tensor filled_;   // float64 [1]: applied steps in the window (at most `window`)
  at::Tensor next_;     // int64 [1]: the slot the next applied step overwrites
  at::Tensor slots_;    // int64 [window]: 0 .. window - 1
  at::Tensor at_next_;  // bool [window]: scratch
  at::Tensor values_;   // float64 [2]: this step's loss and norm
  at::Tensor mean_;     // float64 [2]
  at::Tensor std_;      // float64 [2]
  at::Tensor z_;        // float64 [2]: the thresholds (0 where a value is not judged)
  at::Tensor judged_;   // bool [2]: which values are judged
  at::Tensor over_;     // bool [2]: scratch
  at::Tensor spike_;    // float [1]
  at::Tensor stats_;  // float64 [6]: this step's values, means and deviations (write_state's order)
  at::Tensor last_spike_;  // float64 [6]: stats_ of the last spike
};

// train.inject_spike: "STEP[; STEP ...]" (steps from 1): the loss of that step is multiplied by
// kInjectedSpike on every rank, before backward (a test hook, like train.inject_nonfinite).
// Throws std::invalid_argument for a malformed entry.
std::vector<int64_t> parse_spike_injections(const std::string& text);
inline constexpr double kInjectedSpike = 1000.0;

}  // namespace train
