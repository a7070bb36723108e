// StepProfiler: an ATen (Kineto) profiler trace of a few training steps, the same trace
// torch.profiler writes, so that one tool reads the trainer's and a PyTorch script's side by
// side (bench/profile_summary.py; chrome://tracing or ui.perfetto.dev show it too).
//
// Contract: with `dir` empty it does nothing and costs nothing. Otherwise it records steps
// first..first+count-1 (1-based, the step numbers of the log) and writes
// <dir>/trace_rank<R>.json when the last of them ends, or when the run ends before that.
// Each phase of the step is a StepPhase ("step/forward", "step/backward", ...); without a
// profiler on, RecordFunction's cost is a flag test.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>

namespace train {

// A named phase of the training step ("step/forward"), recorded as a user annotation for its
// lifetime (as torch.profiler.record_function) when a profiler is on.
class StepPhase {
 public:
  explicit StepPhase(const char* name) : record_(at::RecordScope::USER_SCOPE) {
    if (record_.isActive()) record_.before(name);
  }
  StepPhase(const StepPhase&) = delete;
  StepPhase& operator=(const StepPhase&) = delete;

 private:
  at::RecordFunction record_;
};

class StepProfiler {
 public:
  StepProfiler(std::string dir, int64_t first, int64_t count, int rank, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each step (1-based step numbers).
  void before_step(int64_t step);
  void after_step(int64_t step);
  // Writes the trace now if one is being recorded (a run that stops early).
  void finish();

 private:
  std::string dir_;
  int64_t first_, last_;
  int rank_;
  bool cuda_;
  bool active_ = false;
};

}  // namespace train
