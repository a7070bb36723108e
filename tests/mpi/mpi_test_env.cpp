#include "mpi_test_env.h"

#include <stdexcept>

namespace trainer_test {
namespace {
ddp::MpiRuntime* g_runtime = nullptr;
}

void set_runtime(ddp::MpiRuntime* runtime) { g_runtime = runtime; }

ddp::MpiRuntime& runtime() {
  if (g_runtime == nullptr) throw std::logic_error("MPI tests need mpi_test_main.cpp");
  return *g_runtime;
}

}  // namespace trainer_test
