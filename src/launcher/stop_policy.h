// The stop policy: when a signal ends training early, and the exit code it ends with
// (launcher/signals.h has the signals' contract).
//
// - SIGINT / SIGTERM stop the run after the current step; the exit code is 128 + the signal.
// - SIGUSR1, the preemption warning, stops the run only when the requeued job would continue
//   from the checkpoint written now (checkpoint.dir set, checkpoint.resume: auto); otherwise
//   stopping early would only lose the time left, so training goes on and rank 0 says why. A
//   run stopped by it exits 128 + SIGUSR1 (slurm/train.sbatch requeues the job), unless the
//   warning came with the last step: the run is complete, nothing to requeue, exit 0.
//
// A signal reaches the ranks one by one (srun passes it on to each task), and the ranks stop
// together when any of them asks (the step's status vote). So a rank may stop for a signal it
// has not received yet: the signal a stopped run ends for is agreed over the ranks
// (agree_on_stop_signal), and rank 0 says why even when the warning reached only the others.
#pragma once

#include <cstdint>

#include "ddp/communicator.h"
#include "train/options.h"

namespace launcher {

class StopPolicy {
 public:
  StopPolicy(int rank, const checkpoint::CheckpointOptions& checkpoint);
  // Polled by the Trainer once per step: whether this rank asks to stop after it.
  bool stop_requested();
  // After a run that stopped at `steps_done` of `steps` for the agreed `signal`: rank 0's line for
  // a SIGUSR1 stop that its own polls did not see.
  void stopped(int signal, int64_t steps_done, int64_t steps);

 private:
  int rank_;
  checkpoint::CheckpointOptions checkpoint_;
  bool resumable_;
  bool warned_ = false;  // the SIGUSR1 warning was logged
};

// The signal every rank of a stopped run ends for, from each rank's own (stop_signal(), 0 when
// none reached it yet): a terminating one (SIGINT, SIGTERM; the larger number when ranks differ)
// before the preemption warning. Collective over `control`.
int agree_on_stop_signal(ddp::Communicator& control, int signal);

// The exit code of a run that ended: `stopped` (by a signal, all ranks agreed), `signal`
// (stop_signal()), the steps done and train.steps.
int exit_code_after_run(bool stopped, int signal, int64_t steps_done, int64_t steps);

}  // namespace launcher
