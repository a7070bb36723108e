// SIGINT / SIGTERM ask the job to stop after the current step (all ranks agree through the step's
// status vote, write a checkpoint and exit). A second signal ends the process at once.
#pragma once

namespace launcher {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal received, 0 if none

}  // namespace launcher
