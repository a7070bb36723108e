#include "launcher/stop_policy.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>

#include "launcher/exit_codes.h"
#include "launcher/resume.h"
#include "launcher/signals.h"

namespace launcher {

StopPolicy::StopPolicy(int rank, const checkpoint::CheckpointOptions& checkpoint)
    : rank_(rank), checkpoint_(checkpoint), resumable_(requeue_resumes(checkpoint)) {}

bool StopPolicy::stop_requested() {
  if (preemption_warned() && !warned_ && !terminate_requested()) {
    warned_ = true;
    if (rank_ == 0 && resumable_) {
      spdlog::warn("SIGUSR1: preemption warning: stopping after this step with a checkpoint in {} "
                   "(exit code {}); the requeued job continues from it (checkpoint.resume: auto)",
                   checkpoint_.dir, 128 + SIGUSR1);
    } else if (rank_ == 0) {
      spdlog::warn("SIGUSR1: preemption warning ignored: {}, so a requeued job would start again "
                   "at step 1; training on until the job ends",
                   checkpoint_.dir.empty() ? "checkpoint.dir is not set"
                                           : "checkpoint.resume is not 'auto'");
    }
  }
  return terminate_requested() || (resumable_ && preemption_warned());
}

void StopPolicy::stopped(int signal, int64_t steps_done, int64_t steps) {
  if (rank_ != 0 || warned_ || signal != SIGUSR1 || !resumable_ || steps_done >= steps) return;
  warned_ = true;
  spdlog::warn("SIGUSR1: preemption warning (it reached other ranks first): stopped after step {} "
               "with a checkpoint in {} (exit code {}); the requeued job continues from it "
               "(checkpoint.resume: auto)",
               steps_done, checkpoint_.dir, 128 + SIGUSR1);
}

int agree_on_stop_signal(ddp::Communicator& control, int signal) {
  // Ranked for a maximum: none 0, SIGUSR1 itself, a terminating signal 100 + its number.
  constexpr int kTerminating = 100;
  const int mine = signal == 0 || signal == SIGUSR1 ? signal : kTerminating + signal;
  at::Tensor v = at::tensor({static_cast<double>(mine)}, at::kDouble);
  control.all_reduce(v, ddp::ReduceOp::kMax, "stop signal");
  const int agreed = static_cast<int>(v.item<double>());
  return agreed >= kTerminating ? agreed - kTerminating : agreed;
}

int exit_code_after_run(bool stopped, int signal, int64_t steps_done, int64_t steps) {
  if (!stopped) return kExitOk;
  // A preemption warning that came with the last step: the run is complete, nothing to requeue.
  if (signal == SIGUSR1 && steps_done >= steps) return kExitOk;
  return 128 + std::max(signal, 0);
}

}  // namespace launcher
