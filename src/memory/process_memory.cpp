#include "memory/process_memory.h"

#include <cstdio>
#include <cstring>

namespace memory {

ProcessMemory sample_process_memory() noexcept {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.resident_bytes = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak_resident_bytes = kib * 1024;
  }
  std::fclose(f);
  return m;
}

MachineMemory sample_machine_memory() noexcept {
  MachineMemory m;
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long kib = 0;
    if (std::sscanf(line, "MemTotal: %lld kB", &kib) == 1) m.total_bytes = kib * 1024;
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) m.available_bytes = kib * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace memory
