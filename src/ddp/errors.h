// Typed errors of the ddp layer. Only the launcher decides to exit; everything here throws.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// A failed MPI/NCCL/CUDA call or a broken communicator. The message names the call, file, line
// and rank.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective that did not complete before its deadline (ddp.timeout_s). The job cannot
// continue: some other rank is stalled or gone.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

// A batch plan that cannot be made from the user's settings (e.g. more ranks than samples).
class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace ddp
