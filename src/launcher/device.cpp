#include "launcher/device.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>

#include "memory/allocator_guard.h"
#include "memory/process_memory.h"

namespace launcher {

int visible_cuda_devices() noexcept {
  try {
    return static_cast<int>(torch::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

namespace {

// CUDA_VISIBLE_DEVICES as a message says it: unset, set but empty (no GPU visible), or its value.
std::string visible_note(const std::optional<std::string>& cuda_visible) {
  if (!cuda_visible) return "CUDA_VISIBLE_DEVICES unset";
  if (cuda_visible->empty()) return "CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible";
  return fmt::format("CUDA_VISIBLE_DEVICES={}", *cuda_visible);
}

}  // namespace

DeviceBinding bind_device(const std::string& requested, int local_rank, int local_size,
                          int visible_devices, const std::optional<std::string>& cuda_visible) {
  const std::string note = visible_note(cuda_visible);
  if (requested == "cpu" || (requested == "auto" && visible_devices == 0)) {
    return {c10::Device(c10::kCPU), "cpu"};
  }
  if (visible_devices == 0) {
    throw DeviceError(fmt::format(
        "train.device is 'cuda' but this process sees no CUDA device ({}; no driver or no GPU). "
        "Use train.device: cpu or auto, or check CUDA_VISIBLE_DEVICES.",
        note));
  }
  if (local_size > visible_devices) {
    throw DeviceError(fmt::format(
        "{} ranks were started on this node but only {} GPU(s) are visible ({}): two ranks would "
        "share a GPU. Start at most {} rank(s) per node, make more GPUs visible, or set "
        "train.device: cpu.",
        local_size, visible_devices, note, visible_devices));
  }
  const int index = local_rank % visible_devices;
  return {c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)),
          fmt::format("cuda:{} (of {} visible, {})", index, visible_devices, note)};
}

namespace {

// The machine's available memory (MemAvailable); tests state it with TRAINER_TEST_AVAILABLE_MB
// (MiB), nothing else may set it.
int64_t available_memory() {
  if (const char* stated = std::getenv("TRAINER_TEST_AVAILABLE_MB")) {
    return static_cast<int64_t>(std::atof(stated) * 1048576.0);
  }
  return memory::sample_machine_memory().available_bytes;
}

}  // namespace

int64_t cpu_budget_auto(int64_t available, int ranks_on_node) {
  if (available <= 0) return 0;
  constexpr int64_t kMiB = int64_t{1} << 20;
  const auto share =
      static_cast<int64_t>(0.9 * static_cast<double>(available)) / std::max(1, ranks_on_node);
  return std::max<int64_t>(64 * kMiB, share - 256 * kMiB);
}

void use_device(const c10::Device& device, const memory::MemoryOptions& memory, int rank,
                int ranks_on_node) {
  if (device.is_cuda()) {
    c10::cuda::set_device(device.index());
    if (memory.fraction > 0) {
      c10::cuda::CUDACachingAllocator::setMemoryFraction(memory.fraction, device.index());
    }
  }
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_budget(memory.cpu_budget_mb < 0
                       ? cpu_budget_auto(available_memory(), ranks_on_node)
                       : static_cast<int64_t>(memory.cpu_budget_mb * 1048576.0));
  guard.set_injections(rank, memory::parse_injections(memory.inject_oom));
}

}  // namespace launcher
