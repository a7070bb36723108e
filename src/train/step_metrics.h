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

#include "ddp/communicator.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/report/results.h"

namespace train {

// train.max_skipped_steps steps in a row had non-finite gradients (any precision). Every rank
// throws it after the same step (the verdict comes from the reduced gradients), so the exit is
// agreed.
class NonFiniteFatal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StepMetrics {
 public:
  StepMetrics() = default;
  // Allocates the device tensors (persistent state, before step 1).
  explicit StepMetrics(c10::Device device);

  // This rank's weighted loss of the step (float64, on the device): zeroed and accumulated by
  // the step.
  at::Tensor& loss() { return loss_; }
  // Fills `r` for step r.step (from 1). Collective.
  void read(StepResult& r, ddp::Communicator& control, const GradClipper& clipper,
            LossScaler& scaler, int64_t max_skipped_steps);

  int64_t host_reads() const { return host_reads_; }
  int64_t skipped_total() const { return skipped_total_; }  // as of the last read

 private:
  // Warns about the steps skipped since the last read; throws past the limit.
  void check_skipped(const StepResult& r, int64_t since, int64_t new_skips, int64_t longest_run,
                     int rank, int64_t max_skipped_steps, bool fp16) const;

  at::Tensor loss_;             // float64 [] on the device
  at::Tensor slots_;            // float64 on the device: what read() copies out at once
  int64_t skipped_total_ = 0;   // skipped steps as of the last read
  int64_t last_read_step_ = 0;  // the step of the last read
  int64_t host_reads_ = 0;
};

}  // namespace train
