// Access to the process's MpiRuntime from MPI tests.
#pragma once

#include "ddp/mpi_runtime.h"

namespace trainer_test {

void set_runtime(ddp::MpiRuntime* runtime);
ddp::MpiRuntime& runtime();

}  // namespace trainer_test
