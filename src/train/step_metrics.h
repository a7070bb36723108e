// StepMetrics: the numbers a logged step reads from the device, and the one read that copies them
// (Note [No host synchronisation in the step] in train/trainer.cpp). The step accumulates its
// loss into loss() on the device; read() copies that loss, the gradient norm and fp16's scaler
// state to the host at once, averages the loss over ranks, logs the steps skipped since the last
// read and throws NonFiniteFatal past train.max_skipped_steps in a row.
//
// Collective: read() all-reduces the loss on the control communicator; every rank calls it after
// the same steps.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/communicator.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/report/results.h"
#include "train/spike_guard.h"

namespace train {

// train.max_skipped_steps steps in a row were skipped (non-finite gradients in any precision, or
// spikes under train.skip_spikes). Every rank throws it after the same step (the verdict comes
// from values every rank holds alike), so the exit is agreed.
class NonFiniteFatal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StepMetrics {
 public:
  StepMetrics() = default;
  // Allocates the device tensors (persistent state, before step 1); `objective`: the names of the
  // objective's metrics (train/objective.h: kPreferenceMetrics; empty for lm).
  explicit StepMetrics(c10::Device device, std::vector<std::string> objective = {});

  // This rank's weighted loss of the step (float64, on the device): zeroed and accumulated by
  // the step.
  at::Tensor& loss() { return loss_; }
  // The objective's metric sums of the step (float64 [names], on the device; undefined for
  // lm), zeroed with the loss and accumulated by the step, each micro-batch's scaled by its
  // share of the global batch: read() sums them over ranks into StepResult::objective.
  const at::Tensor& objective() const { return objective_; }
  void zero() {
    loss_.zero_();
    if (objective_.defined()) objective_.zero_();
  }
  // Fills `r` for step r.step (from 1). Collective.
  // `guard`: train.skip_spikes (null: off), for the spike's numbers in the warning.
  void read(StepResult& r, ddp::Communicator& control, const GradClipper& clipper,
            LossScaler& scaler, const SpikeGuard* guard, int64_t max_skipped_steps);

  int64_t host_reads() const { return host_reads_; }
  int64_t skipped_total() const { return skipped_total_; }  // as of the last read

 private:
  // What read() copied out about skipped steps.
  struct Skips {
    int64_t since = 0;              // the step of the previous read
    int64_t new_skips = 0;          // skipped since then
    int64_t new_spikes = 0;         // of those, skipped by the spike guard
    int64_t longest_run = 0;        // the longest run in a row since then
    int64_t last = 0;               // the last skipped step
    const double* guard = nullptr;  // SpikeGuard::write_state's slots (null: no guard)
    const SpikeGuardOptions* spikes = nullptr;
  };
  // Warns about the steps skipped since the last read; throws past the limit.
  void check_skipped(const StepResult& r, const Skips& s, int rank, int64_t max_skipped_steps,
                     bool fp16) const;

  // slots_'s layout, which read() packs and copies out at once: the loss, the gradient norm, then
  // LossScaler's and SpikeGuard's write_state slots (indexed by their own names), then the
  // objective's sums. Each offset is
  // the one before plus its width, so a slot added anywhere moves the ones after it.
  static constexpr int64_t kLossSlot = 0;
  static constexpr int64_t kNormSlot = kLossSlot + 1;
  static constexpr int64_t kScalerSlots = kNormSlot + 1;
  static constexpr int64_t kGuardSlots = kScalerSlots + LossScaler::kStateSlots;
  static constexpr int64_t kSlots = kGuardSlots + SpikeGuard::kStateSlots;

  at::Tensor loss_;       // float64 [] on the device
  at::Tensor objective_;  // float64 [objective_names_] on the device, or undefined
  std::vector<std::string> objective_names_;
  at::Tensor slots_;            // float64 [kSlots] on the device
  int64_t skipped_total_ = 0;   // skipped steps as of the last read
  int64_t spikes_total_ = 0;    // of those, spikes
  int64_t last_read_step_ = 0;  // the step of the last read
  int64_t host_reads_ = 0;
};

}  // namespace train
