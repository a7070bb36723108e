// NcclCommunicator: Communicator over NCCL for CUDA tensors (the data plane on GPUs).
//
// - Bootstrap over the control plane: rank 0 makes the NCCL unique id and broadcasts it through
//   the given (MPI) communicator; NCCL never bootstraps itself.
// - The NCCL communicator is created non-blocking (ncclCommInitRankConfig, blocking = 0); every
//   NCCL call may return ncclInProgress, and completion is polled against the deadline, so a
//   stalled peer ends in CommTimeout (and ncclCommAbort) instead of a hang.
// - Collectives run on a dedicated communication stream, ordered after the work already queued on
//   the caller's current stream by a CUDA event; wait() makes the caller's stream wait for the
//   result. Tensors are recorded on the communication stream so the caching allocator does not
//   reuse their memory early.
// Only compiled where the CUDA toolkit and NCCL are found (TRAINER_HAVE_CUDA).
#pragma once

#include <memory>
#include <string>

#include "ddp/communicator.h"

namespace ddp {

// Creates the NCCL communicator for `device` (a CUDA device index) over the ranks of `bootstrap`.
// Throws CommError when the build has no NCCL or the device cannot be used.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     std::chrono::duration<double> timeout);

// Whether this build has the NCCL path.
bool nccl_available();

// What this build was compiled with, for --version: "CUDA 12.8, NCCL 2.27.5" (the headers'
// versions; NCCL's with " (loaded: 2.27.3)" when the library the process loaded differs), or
// "CPU only".
std::string gpu_build();

}  // namespace ddp
