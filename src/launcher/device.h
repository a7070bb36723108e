// Device binding: which device each rank trains on. Rank uses CUDA device
// local_rank % visible (CUDA_VISIBLE_DEVICES is honoured by the CUDA runtime itself); two local
// ranks on one GPU is an error, since NCCL refuses it and it would halve both ranks' memory.
#pragma once

#include <c10/core/Device.h>

#include <stdexcept>
#include <string>

#include "memory/options.h"

namespace launcher {

struct DeviceBinding {
  c10::Device device{c10::kCPU};
  std::string description;  // "cpu" or "cuda:1 (of 4 visible, CUDA_VISIBLE_DEVICES=2,3,4,5)"
};

class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `requested`: train.device (auto | cpu | cuda). `visible_devices`: CUDA devices this process
// sees. `cuda_visible`: the CUDA_VISIBLE_DEVICES value, for messages ("" when unset).
DeviceBinding bind_device(const std::string& requested, int local_rank, int local_size,
                          int visible_devices, const std::string& cuda_visible);

// CUDA devices this process can use; 0 without a driver or GPU (never throws).
int visible_cuda_devices() noexcept;

// Makes `device` this process's current CUDA device (when it is one) and applies the config's
// memory limits, as training and the one-process commands (--generate, --export-hf) alike run
// under them: memory.fraction of a CUDA device, the CPU allocator guard's budget
// (memory.cpu_budget_mb) and the injections of rank `rank` (memory.inject_oom).
void use_device(const c10::Device& device, const memory::MemoryOptions& memory, int rank);

}  // namespace launcher
