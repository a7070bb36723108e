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

// Makes glibc's malloc keep freed blocks of up to 32 MiB (its ceiling) in the heap for reuse,
// rather than returning them to the kernel: a training step frees and allocates the same
// activation sizes every step, and each fresh block costs a page fault per 4 KiB page (about
// 10 ms for 16 MiB here; steps of a 3.2M-parameter GPT saw a tenth of their time go to it).
// Resident memory then stays near the peak instead of falling between steps. Call once, before
// any threads allocate. No effect with another malloc.
void keep_freed_memory_for_reuse() noexcept;

}  // namespace memory
