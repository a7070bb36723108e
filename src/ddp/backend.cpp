#include "ddp/backend.h"

#include <fmt/format.h>

#include <stdexcept>

#include "ddp/mpi_communicator.h"
#include "ddp/nccl_communicator.h"

namespace ddp {

std::string resolve_backend(const std::string& requested, c10::Device device, bool nccl_built) {
  if (requested == "mpi") return "mpi";
  if (requested == "nccl") {
    if (!device.is_cuda()) {
      throw std::invalid_argument(fmt::format(
          "ddp.backend: 'nccl' reduces CUDA tensors, but this rank trains on {}; use ddp.backend: "
          "auto or mpi, or train.device: cuda",
          device.str()));
    }
    if (!nccl_built) {
      throw std::invalid_argument("ddp.backend: 'nccl', but this trainer was built without NCCL");
    }
    return "nccl";
  }
  if (requested != "auto") {
    throw std::invalid_argument(fmt::format("ddp.backend: unknown backend '{}'", requested));
  }
  return device.is_cuda() && nccl_built ? "nccl" : "mpi";
}

std::unique_ptr<Communicator> make_data_communicator(const std::string& backend, c10::Device device,
                                                     Communicator& control,
                                                     std::chrono::duration<double> timeout) {
  if (backend == "nccl") return make_nccl_communicator(control, device.index(), timeout);
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&control);
  if (mpi == nullptr) throw std::logic_error("the control communicator must be an MpiCommunicator");
  return mpi->duplicate(timeout);
}

}  // namespace ddp
