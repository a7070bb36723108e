// Checks for MPI, NCCL and CUDA calls: on failure they throw ddp::CommError naming the call,
// file, line and rank. Private to src/ddp (the only place that includes mpi.h / nccl.h).
#pragma once

#include <string>

namespace ddp::detail {

// World rank if MPI is initialised, else -1. Never throws.
int world_rank_or_unknown() noexcept;

[[noreturn]] void throw_call_error(const char* api, const char* call, const std::string& reason,
                                   const char* file, int line);

}  // namespace ddp::detail

#define TRAINER_MPI_CHECK(call)                                                              \
  do {                                                                                       \
    const int trainer_rc_ = (call);                                                          \
    if (trainer_rc_ != MPI_SUCCESS) {                                                        \
      char trainer_msg_[MPI_MAX_ERROR_STRING];                                               \
      int trainer_len_ = 0;                                                                  \
      MPI_Error_string(trainer_rc_, trainer_msg_, &trainer_len_);                            \
      ::ddp::detail::throw_call_error("MPI", #call, std::string(trainer_msg_, trainer_len_), \
                                      __FILE__, __LINE__);                                   \
    }                                                                                        \
  } while (0)

#define TRAINER_NCCL_CHECK(call)                                                                \
  do {                                                                                          \
    const ncclResult_t trainer_rc_ = (call);                                                    \
    if (trainer_rc_ != ncclSuccess && trainer_rc_ != ncclInProgress) {                          \
      ::ddp::detail::throw_call_error("NCCL", #call, ncclGetErrorString(trainer_rc_), __FILE__, \
                                      __LINE__);                                                \
    }                                                                                           \
  } while (0)

#define TRAINER_CUDA_CHECK(call)                                                                \
  do {                                                                                          \
    const cudaError_t trainer_rc_ = (call);                                                     \
    if (trainer_rc_ != cudaSuccess) {                                                           \
      ::ddp::detail::throw_call_error("CUDA", #call, cudaGetErrorString(trainer_rc_), __FILE__, \
                                      __LINE__);                                                \
    }                                                                                           \
  } while (0)
