// Device binding: which device each rank trains on. Rank uses CUDA device
// local_rank % visible (CUDA_VISIBLE_DEVICES is honoured by the CUDA runtime itself); two local
// ranks on one GPU is an error, since NCCL refuses it and it would halve both ranks' memory.
#pragma once

#include <c10/core/Device.h>

#include <optional>
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
// sees. `cuda_visible`: the CUDA_VISIBLE_DEVICES value, for messages (nullopt when unset; set but
// empty hides every GPU from the CUDA runtime, and the messages say so).
DeviceBinding bind_device(const std::string& requested, int local_rank, int local_size,
                          int visible_devices, const std::optional<std::string>& cuda_visible);

// CUDA devices this process can use; 0 without a driver or GPU (never throws).
int visible_cuda_devices() noexcept;

// Makes `device` this process's current CUDA device (when it is one) and applies the config's
// memory limits, as training and the one-process commands (--generate, --export-hf) alike run
// under them: memory.fraction of a CUDA device, the CPU allocator guard's budget
// (memory.cpu_budget_mb; auto: cpu_budget_auto over `ranks_on_node`) and the injections of rank
// `rank` (memory.inject_oom).
void use_device(const c10::Device& device, const memory::MemoryOptions& memory, int rank,
                int ranks_on_node = 1);

// memory.cpu_budget_mb: auto: 90% of `available` bytes (the machine's MemAvailable at start)
// divided among the node's ranks, less 256 MiB each (what a rank holds besides tensors: LibTorch,
// MPI, the loader's threads); at least 64 MiB. 0 (no budget) when `available` is unknown.
int64_t cpu_budget_auto(int64_t available, int ranks_on_node);

}  // namespace launcher
