#include "launcher/stop_policy.h"

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

int exit_code_after_run(bool stopped, int signal, int64_t steps_done, int64_t steps) {
  if (!stopped) return kExitOk;
  // A preemption warning that came with the last step: the run is complete, nothing to requeue.
  if (signal == SIGUSR1 && steps_done >= steps) return kExitOk;
  return 128 + std::max(signal, 0);
}

}  // namespace launcher
