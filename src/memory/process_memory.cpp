#include "memory/process_memory.h"

#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace memory {
namespace {

// Reads "Name:   N kB" lines of a /proc file into the matching outputs, in bytes. Outputs whose
// line is missing (or the whole file, where /proc is unavailable) keep their values.
void read_kib_fields(const char* path,
                     std::initializer_list<std::pair<const char*, int64_t*>> fields) noexcept {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    for (const auto& [name, out] : fields) {
      const size_t n = std::strlen(name);
      long long kib = 0;
      if (std::strncmp(line, name, n) == 0 && line[n] == ':' &&
          std::sscanf(line + n + 1, "%lld kB", &kib) == 1) {
        *out = kib * 1024;
      }
    }
  }
  std::fclose(f);
}

}  // namespace

ProcessMemory sample_process_memory() noexcept {
  ProcessMemory m;
  read_kib_fields("/proc/self/status",
                  {{"VmRSS", &m.resident_bytes}, {"VmHWM", &m.peak_resident_bytes}});
  return m;
}

MachineMemory sample_machine_memory() noexcept {
  MachineMemory m;
  read_kib_fields("/proc/meminfo",
                  {{"MemTotal", &m.total_bytes}, {"MemAvailable", &m.available_bytes}});
  return m;
}

}  // namespace memory

namespace memory {

void keep_freed_memory_for_reuse() noexcept {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit (larger values are refused); blocks above
  // it are still mapped and unmapped each time. The trim threshold keeps the freed top of the
  // heap too (the default, twice the mmap threshold, would hand most of it back).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace memory
