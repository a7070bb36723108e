// Access to the process's MpiRuntime from MPI tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/mpi_runtime.h"

namespace trainer_test {

void set_runtime(ddp::MpiRuntime* runtime);
ddp::MpiRuntime& runtime();

// ||a - b|| / ||b|| over all tensors together, in double precision.
double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

}  // namespace trainer_test
