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

}  // namespace memory
