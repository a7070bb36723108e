#include "launcher/device.h"

#include <fmt/format.h>
#include <torch/cuda.h>

namespace launcher {

int visible_cuda_devices() noexcept {
  try {
    return static_cast<int>(torch::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

DeviceBinding bind_device(const std::string& requested, int local_rank, int local_size,
                          int visible_devices, const std::string& cuda_visible) {
  const std::string visible_note =
      cuda_visible.empty() ? std::string("CUDA_VISIBLE_DEVICES unset")
                           : fmt::format("CUDA_VISIBLE_DEVICES={}", cuda_visible);
  if (requested == "cpu" || (requested == "auto" && visible_devices == 0)) {
    return {c10::Device(c10::kCPU), "cpu"};
  }
  if (visible_devices == 0) {
    throw DeviceError(fmt::format(
        "train.device is 'cuda' but this process sees no CUDA device ({}; no driver or no GPU). "
        "Use train.device: cpu or auto, or check CUDA_VISIBLE_DEVICES.", visible_note));
  }
  if (local_size > visible_devices) {
    throw DeviceError(fmt::format(
        "{} ranks were started on this node but only {} GPU(s) are visible ({}): two ranks would "
        "share a GPU. Start at most {} rank(s) per node, make more GPUs visible, or set "
        "train.device: cpu.", local_size, visible_devices, visible_note, visible_devices));
  }
  const int index = local_rank % visible_devices;
  return {c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)),
          fmt::format("cuda:{} (of {} visible, {})", index, visible_devices, visible_note)};
}

}  // namespace launcher
