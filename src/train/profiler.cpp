#include "train/profiler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>

namespace train {
namespace {
namespace prof = torch::profiler::impl;

std::set<prof::ActivityType> activities(bool cuda) {
  std::set<prof::ActivityType> a{prof::ActivityType::CPU};
  if (cuda) a.insert(prof::ActivityType::CUDA);
  return a;
}
prof::ProfilerConfig config() { return prof::ProfilerConfig(prof::ProfilerState::KINETO); }
}  // namespace

StepProfiler::StepProfiler(std::string dir, int64_t first, int64_t count, int rank, bool cuda)
    : dir_(std::move(dir)), first_(first), last_(first + count - 1), rank_(rank), cuda_(cuda) {
  if (dir_.empty() || count <= 0) return;
  std::filesystem::create_directories(dir_);
  // Kineto's set-up (loading CUPTI on a GPU) happens here, not inside the first traced step.
  torch::autograd::profiler::prepareProfiler(config(), activities(cuda_));
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: the profiler trace was not written: {}", rank_, e.what());
  }
}

void StepProfiler::before_step(int64_t step) {
  if (dir_.empty() || step != first_) return;
  torch::autograd::profiler::enableProfiler(config(), activities(cuda_));
  active_ = true;
}

void StepProfiler::after_step(int64_t step) {
  if (active_ && step >= last_) finish();
}

void StepProfiler::finish() {
  if (!active_) return;
  active_ = false;
  const auto result = torch::autograd::profiler::disableProfiler();
  const std::string path = fmt::format("{}/trace_rank{}.json", dir_, rank_);
  result->save(path);
  if (rank_ == 0) {
    spdlog::info("profiler trace of steps {}-{} written to {} (one file per rank; "
                 "bench/profile_summary.py {} sums it per phase and operator)",
                 first_, last_, path, path);
  }
}

}  // namespace train
