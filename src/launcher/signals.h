// Stop requests by signal. All ranks agree on the last step through the step's status vote, rank
// 0 writes checkpoint.dir/final.safetensors, and the process exits with 128 + stop_signal().
//
// - SIGINT / SIGTERM (Ctrl-C, scancel, the time limit): stop after the current step. A second
//   SIGINT or SIGTERM ends the process at once.
// - SIGUSR1: SLURM's warning before the time limit or a preemption (sbatch
//   --signal=B:USR1@SECONDS, forwarded to the tasks by slurm/train.sbatch, which requeues the job
//   when the trainer exits 128 + SIGUSR1). main() acts on it only when a requeued job would
//   continue from the checkpoint (checkpoint.dir set, checkpoint.resume: auto). It never ends the
//   process by itself, and a SIGINT/SIGTERM, before or after it, wins: the job is being
//   cancelled, so stop_signal() is that one and the job is not requeued.
// The handlers only set flags (async-signal-safe); the training loop polls them once per step.
#pragma once

namespace launcher {

// SIGUSR1, installed first thing in main(): a warning that comes during start-up (which can take
// minutes) is kept for the first step instead of killing the process (its default action).
void install_preemption_handler();
// SIGINT and SIGTERM, installed once training starts (before that they end the process at once).
void install_stop_handlers();
bool terminate_requested();  // SIGINT or SIGTERM came
bool preemption_warned();    // SIGUSR1 came
// The signal the exit code reports: SIGINT/SIGTERM if one came, else SIGUSR1 if it came, else 0.
int stop_signal();

}  // namespace launcher
