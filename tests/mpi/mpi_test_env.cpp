#include "mpi_test_env.h"

#include <ATen/ATen.h>

#include <cmath>
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

double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0;
  double norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i].to(at::kDouble) - b[i].to(at::kDouble)).pow(2).sum().item<double>();
    norm += b[i].to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

}  // namespace trainer_test
