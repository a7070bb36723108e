// Which communicator carries gradients: NCCL for CUDA tensors, MPI for CPU tensors (and for CUDA
// tensors staged through the host when asked for). MPI stays the control plane either way.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/communicator.h"

namespace ddp {

// ddp.backend (auto | nccl | mpi) and the training device -> "nccl" or "mpi".
// Throws std::invalid_argument naming ddp.backend for impossible combinations.
std::string resolve_backend(const std::string& requested, c10::Device device, bool nccl_built);

// The data-plane communicator for `backend` over the ranks of `control`. Collective.
std::unique_ptr<Communicator> make_data_communicator(const std::string& backend, c10::Device device,
                                                     Communicator& control,
                                                     std::chrono::duration<double> timeout);

}  // namespace ddp
