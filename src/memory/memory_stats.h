// Per-rank memory statistics, and the job's memory table (issue: per-rank memory checks).
//
// A MemorySample is what one rank knows about its own memory: on CUDA the caching allocator's
// allocated / reserved / peak bytes, the device's free / total (cudaMemGetInfo) and, where NVML
// loads (dlopen "libnvidia-ml.so.1" at run time; no link-time dependency), utilisation and used
// memory; on CPU the tensor bytes counted by the CPU allocator guard, the process's resident and
// peak resident memory, and the machine's available / total memory (or the budget, when
// memory.cpu_budget_mb is set). A field that cannot be known is -1 and prints as n/a.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memory {

struct MemorySample {
  int64_t tensor_bytes = -1;       // live tensor memory
  int64_t tensor_peak_bytes = -1;  // its peak since the last reset
  int64_t reserved_bytes = -1;     // CUDA caching allocator reserve
  int64_t resident_bytes = -1;     // process RSS
  int64_t peak_resident_bytes = -1;
  int64_t free_bytes = -1;       // device free (CUDA) or budget / machine available (CPU)
  int64_t total_bytes = -1;      // device total (CUDA) or budget / machine total (CPU)
  double utilization = -1;       // NVML GPU utilisation, percent
  int64_t nvml_used_bytes = -1;  // NVML used memory (all processes on the device)

  // The share of its device this rank uses now (tensor peak for CPU budgets, device used for
  // CUDA); -1 when unknown.
  double used_fraction() const;

  std::vector<double> to_vector() const;
  static MemorySample from_vector(const double* v);
  static constexpr int kFields = 9;
};

// Never throws; unknown fields stay -1.
MemorySample sample_memory(c10::Device device);

// "12.3 MiB": how the plans and fallbacks write a byte count.
std::string mib_text(int64_t bytes);

// Starts a new peak window (CUDA allocator peak, CPU allocator guard peak).
void reset_peaks(c10::Device device);

// Rank 0's table: one row per rank, then warnings for ranks above `high_watermark` of their
// device or far above the others. Pure: formatting only.
std::string format_memory_table(const std::vector<MemorySample>& ranks, const std::string& title,
                                double high_watermark, std::vector<std::string>* warnings);

}  // namespace memory
