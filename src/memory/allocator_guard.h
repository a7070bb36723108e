// Out-of-memory errors on the CPU, raised where real ones are: inside LibTorch's CPU allocator.
//
// CpuAllocatorGuard installs (once per process) an allocator that wraps LibTorch's CPU allocator
// and throws c10::OutOfMemoryError, exactly as the CUDA caching allocator does, when
// - a tensor memory budget (memory.cpu_budget_mb) would be exceeded, or
// - an injected OOM (memory.inject_oom) is armed for this rank, step and phase.
// The training loop catches both the same way it catches a real CUDA OOM. On CUDA, injections
// fire at the start of the armed phase (the CPU allocator is not on that path).
//
// Thread safety: counters are atomic; arm()/set_phase() are called by the training thread, and
// injections fire only for allocations on that thread (the loader's threads allocate at the same
// time; they count against the budget like any other allocation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memory {

// The optimizer phase (gradient clipping and the update) allocates nothing by design
// (train/optimizer.h); an injection there fires at its start and tests that an out-of-memory
// error the protocol cannot undo ends the job instead of hanging it.
enum class Phase { kNone, kForward, kBackward, kOptimizer };
const char* to_string(Phase phase);

struct Injection {
  int rank = 0;
  int64_t step = 0;
  Phase phase = Phase::kForward;
  int times = 1;  // how many attempts of that step fail (-1: every attempt)
};

// Parses "rank:step:phase[:times]" entries separated by ';' (times: a number or 'always').
// Throws std::invalid_argument naming memory.inject_oom.
std::vector<Injection> parse_injections(const std::string& text);

class CpuAllocatorGuard {
 public:
  // Installs the wrapping allocator on first use; later calls reconfigure it.
  static CpuAllocatorGuard& instance();

  void set_budget(int64_t bytes);  // 0: none
  void set_injections(int rank, std::vector<Injection> injections);
  // Called by the training loop: which step and phase the next allocations belong to.
  void set_phase(int64_t step, Phase phase);

  int64_t allocated_bytes() const;
  int64_t peak_bytes() const;
  void reset_peak();
  int64_t budget_bytes() const;

  // Throws c10::OutOfMemoryError if an injection is armed for the current step and phase
  // (used where allocations do not pass through the CPU allocator, i.e. on CUDA).
  void check_injection(int64_t bytes);

 private:
  CpuAllocatorGuard();
};

}  // namespace memory
