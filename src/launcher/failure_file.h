// checkpoint.dir/failure.json: which rank(s) and node(s) a job lost, for scripts to read
// (slurm/train.sbatch restarts on the surviving nodes; docs/DESIGN.md, "Failure instead of hangs").
//
// Contract: arm() is collective (an all-gather of host names on the control communicator) and is
// called by every rank once after start-up; write() is called by one rank as it ends the job for
// an error after start-up (main's abort path), before MPI_Abort. The file is written only when the
// failure is attributed: a collective timed out and the desync exchange (ddp/desync.h) named ranks
// that did not answer. Of the ranks that answered, the lowest writes it (through a temporary file
// and a rename, so a reader never sees half a file). Nothing here throws.
#pragma once

#include <exception>
#include <string>

#include "ddp/communicator.h"

namespace launcher {

void arm_failure_file(ddp::Communicator& control, int rank, const std::string& hostname,
                      const std::string& checkpoint_dir);
// The path written, or "" when nothing was (not armed, no checkpoint.dir, not attributed, or not
// this rank's to write).
std::string write_failure_file(const std::exception& e, int exit_code) noexcept;

}  // namespace launcher
