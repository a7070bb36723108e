// Resident memory of this process, from /proc/self/status (CPU side of the per-rank checks).
#pragma once

#include <cstdint>

namespace memory {

struct ProcessMemory {
  int64_t resident_bytes = 0;       // VmRSS
  int64_t peak_resident_bytes = 0;  // VmHWM
};

// Zeros where /proc is unavailable. Never throws.
ProcessMemory sample_process_memory() noexcept;

}  // namespace memory
