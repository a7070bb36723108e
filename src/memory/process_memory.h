// Resident memory of this process (/proc/self/status) and the machine's available memory
// (/proc/meminfo): the CPU side of the per-rank checks.
#pragma once

#include <cstdint>

namespace memory {

struct ProcessMemory {
  int64_t resident_bytes = 0;       // VmRSS
  int64_t peak_resident_bytes = 0;  // VmHWM
};

// Zeros where /proc is unavailable. Never throws.
ProcessMemory sample_process_memory() noexcept;

struct MachineMemory {
  int64_t available_bytes = -1;  // MemAvailable
  int64_t total_bytes = -1;      // MemTotal
};

// -1 where /proc/meminfo is unreadable. Never throws.
MachineMemory sample_machine_memory() noexcept;

}  // namespace memory
