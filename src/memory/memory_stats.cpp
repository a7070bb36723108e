#include "memory/memory_stats.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "memory/allocator_guard.h"
#include "memory/process_memory.h"

#if TRAINER_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#endif

namespace memory {
namespace {

constexpr double kMiB = 1048576.0;

// The few NVML entry points we use; their C ABI has been stable since NVML 5.
struct Nvml {
  using Device = void*;
  struct Utilization {
    unsigned int gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    n.by_pci = reinterpret_cast<int (*)(const char*, Nvml::Device*)>(
        dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.utilization = reinterpret_cast<int (*)(Nvml::Device, Nvml::Utilization*)>(
        dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    n.memory = reinterpret_cast<int (*)(Nvml::Device, Nvml::Memory*)>(
        dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    n.ok = n.init && n.by_pci && n.utilization && n.memory && n.init() == 0;
  });
  return n;
}

std::string mib(int64_t bytes) {
  return bytes < 0 ? std::string("n/a") : fmt::format("{:.0f}", bytes / kMiB);
}

}  // namespace

double MemorySample::used_fraction() const {
  if (total_bytes <= 0) return -1;
  if (reserved_bytes >= 0 && free_bytes >= 0) {  // CUDA: the device as a whole
    return double(total_bytes - free_bytes) / total_bytes;
  }
  return tensor_peak_bytes >= 0 ? double(tensor_peak_bytes) / total_bytes : -1;
}

std::vector<double> MemorySample::to_vector() const {
  return {double(tensor_bytes),        double(tensor_peak_bytes),
          double(reserved_bytes),      double(resident_bytes),
          double(peak_resident_bytes), double(free_bytes),
          double(total_bytes),         utilization,
          double(nvml_used_bytes)};
}

MemorySample MemorySample::from_vector(const double* v) {
  MemorySample s;
  s.tensor_bytes = int64_t(v[0]);
  s.tensor_peak_bytes = int64_t(v[1]);
  s.reserved_bytes = int64_t(v[2]);
  s.resident_bytes = int64_t(v[3]);
  s.peak_resident_bytes = int64_t(v[4]);
  s.free_bytes = int64_t(v[5]);
  s.total_bytes = int64_t(v[6]);
  s.utilization = v[7];
  s.nvml_used_bytes = int64_t(v[8]);
  return s;
}

MemorySample sample_memory(c10::Device device) {
  MemorySample s;
  const ProcessMemory proc = sample_process_memory();
  s.resident_bytes = proc.resident_bytes;
  s.peak_resident_bytes = proc.peak_resident_bytes;
#if TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    try {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      s.tensor_bytes = stats.allocated_bytes[aggregate].current;
      s.tensor_peak_bytes = stats.allocated_bytes[aggregate].peak;
      s.reserved_bytes = stats.reserved_bytes[aggregate].current;
    } catch (...) {
    }
    size_t free = 0, total = 0;
    if (cudaSetDevice(device.index()) == cudaSuccess &&
        cudaMemGetInfo(&free, &total) == cudaSuccess) {
      s.free_bytes = static_cast<int64_t>(free);
      s.total_bytes = static_cast<int64_t>(total);
    }
    char bus_id[32] = {};
    const Nvml& n = nvml();
    Nvml::Device handle = nullptr;
    if (n.ok && cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device.index()) == cudaSuccess &&
        n.by_pci(bus_id, &handle) == 0) {
      Nvml::Utilization u{};
      Nvml::Memory m{};
      if (n.utilization(handle, &u) == 0) s.utilization = u.gpu;
      if (n.memory(handle, &m) == 0) s.nvml_used_bytes = static_cast<int64_t>(m.used);
    }
    return s;
  }
#endif
  auto& guard = CpuAllocatorGuard::instance();
  s.tensor_bytes = guard.allocated_bytes();
  s.tensor_peak_bytes = guard.peak_bytes();
  if (guard.budget_bytes() > 0) {
    s.total_bytes = guard.budget_bytes();
    s.free_bytes = guard.budget_bytes() - guard.allocated_bytes();
  } else {
    const MachineMemory machine = sample_machine_memory();
    s.free_bytes = machine.available_bytes;
    s.total_bytes = machine.total_bytes;
  }
  return s;
}

void reset_peaks(c10::Device device) {
#if TRAINER_HAVE_CUDA
  if (device.is_cuda()) {
    try {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    } catch (...) {
    }
    return;
  }
#endif
  CpuAllocatorGuard::instance().reset_peak();
}

std::string format_memory_table(const std::vector<MemorySample>& ranks, const std::string& title,
                                double high_watermark, std::vector<std::string>* warnings) {
  std::string out = fmt::format(
      "{} (MiB)\n  rank  tensors   peak  reserved    rss  peak rss      free     total  util  "
      "used\n",
      title);
  std::vector<int64_t> peaks;
  for (const auto& s : ranks) peaks.push_back(std::max<int64_t>(s.tensor_peak_bytes, 0));
  std::vector<int64_t> sorted = peaks;
  std::sort(sorted.begin(), sorted.end());
  const int64_t median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& s = ranks[r];
    const double used = s.used_fraction();
    out += fmt::format(
        "  {:>4}  {:>7}  {:>5}  {:>8}  {:>5}  {:>8}  {:>8}  {:>8}  {:>4}  {:>4}\n", r,
        mib(s.tensor_bytes), mib(s.tensor_peak_bytes), mib(s.reserved_bytes), mib(s.resident_bytes),
        mib(s.peak_resident_bytes), mib(s.free_bytes), mib(s.total_bytes),
        s.utilization < 0 ? std::string("n/a") : fmt::format("{:.0f}%", s.utilization),
        used < 0 ? std::string("n/a") : fmt::format("{:.0f}%", 100 * used));
    if (warnings == nullptr) continue;
    if (used > high_watermark) {
      warnings->push_back(
          fmt::format("rank {} uses {:.0f}% of its memory, above memory.high_watermark = {:.0f}%",
                      r, 100 * used, 100 * high_watermark));
    }
    // Far above the others: 1.5x the median peak and at least 64 MiB more.
    if (ranks.size() > 1 && peaks[r] > 1.5 * median && peaks[r] - median > 64 * 1048576LL) {
      warnings->push_back(
          fmt::format("rank {} peaks at {} MiB of tensors, far above the median rank's {} MiB", r,
                      mib(peaks[r]), mib(median)));
    }
  }
  return out;
}

std::string mib_text(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

}  // namespace memory
