// checkpoint.dir/failure.json: which rank(s) and node(s) a job lost, for scripts to read
// (slurm/train.sbatch restarts on the surviving nodes; docs/DESIGN.md, "Failure instead of hangs").
//
// Contract: arm() is collective (an all-gather of host names on the control communicator) and is
// called by every rank once after start-up; write() is called by each rank as it ends the job for
// an error after start-up (main's abort path), before MPI_Abort. The file is written only when the
// failure is attributed: a collective timed out and the desync exchange (ddp/desync.h) named ranks
// that did not answer. Every rank that took part writes what it found (through a temporary file
// of its own and a rename, so a reader never sees half a file): the first to abort kills the
// others, and the lowest rank may be the last to finish its exchange. Nothing here throws.
#pragma once

#include <exception>
#include <string>

#include "ddp/communicator.h"

namespace launcher {

void arm_failure_file(ddp::Communicator& control, int rank, const std::string& hostname,
                      const std::string& checkpoint_dir);
// The path written, or "" when nothing was (not armed, no checkpoint.dir, or not attributed).
std::string write_failure_file(const std::exception& e, int exit_code) noexcept;

}  // namespace launcher
