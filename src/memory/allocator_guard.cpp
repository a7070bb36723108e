#include "memory/allocator_guard.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "memory/process_memory.h"

namespace memory {

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kNone: break;
  }
  return "outside a step";
}

std::vector<Injection> parse_injections(const std::string& text) {
  std::vector<Injection> out;
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    if (entry.find_first_not_of(" ") == std::string::npos) continue;
    std::vector<std::string> f;
    std::stringstream parts(entry);
    for (std::string part; std::getline(parts, part, ':');) {
      const auto b = part.find_first_not_of(' ');
      const auto e = part.find_last_not_of(' ');
      f.push_back(b == std::string::npos ? "" : part.substr(b, e - b + 1));
    }
    auto bad = [&](const std::string& why) {
      return std::invalid_argument(fmt::format(
          "memory.inject_oom: '{}': {} (expected rank:step:phase[:times], e.g. 1:5:backward)",
          entry, why));
    };
    if (f.size() != 3 && f.size() != 4) throw bad("wrong number of fields");
    auto number = [&](const std::string& s, const char* what) {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || end != s.data() + s.size() || v < 0) {
        throw bad(fmt::format("{} '{}' is not a non-negative integer", what, s));
      }
      return v;
    };
    Injection inj;
    inj.rank = static_cast<int>(number(f[0], "rank"));
    inj.step = number(f[1], "step");
    if (f[2] == "forward") {
      inj.phase = Phase::kForward;
    } else if (f[2] == "backward") {
      inj.phase = Phase::kBackward;
    } else if (f[2] == "optimizer") {
      inj.phase = Phase::kOptimizer;
    } else {
      throw bad(fmt::format("phase '{}' is not forward, backward or optimizer", f[2]));
    }
    if (f.size() == 4) inj.times = f[3] == "always" ? -1 : static_cast<int>(number(f[3], "times"));
    out.push_back(inj);
  }
  return out;
}

namespace {

struct State {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> budget{0};
  std::atomic<bool> armed{false};  // some injection may still fire
  std::atomic<int> phase{static_cast<int>(Phase::kNone)};
  std::atomic<int64_t> step{-1};
  // The training thread (the last to call set_phase): injections target its forward and
  // backward, not the loader's threads, which allocate at the same time.
  std::atomic<std::thread::id> phase_thread{};
  std::mutex mutex;  // guards the fields below
  int rank = 0;
  std::vector<Injection> injections;
};

State& state() {
  static State s;
  return s;
}

[[noreturn]] void throw_oom(int64_t bytes, const std::string& why) {
  TORCH_CHECK_WITH(OutOfMemoryError, false,
                   fmt::format("CPU out of memory: tried to allocate {} bytes; {}", bytes, why));
  std::abort();  // not reached
}

// Fires an armed injection for the current step/phase; each attempt of a step fires once.
void maybe_inject(int64_t bytes) {
  State& s = state();
  if (!s.armed.load(std::memory_order_relaxed)) return;
  const auto phase = static_cast<Phase>(s.phase.load());
  if (phase == Phase::kNone) return;
  if (std::this_thread::get_id() != s.phase_thread.load()) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& inj : s.injections) {
    if (inj.rank != s.rank || inj.step != s.step.load() || inj.phase != phase || inj.times == 0)
      continue;
    if (inj.times > 0) --inj.times;
    // What a real error would say: what was free. (On CUDA the injection stands in for the
    // device's allocator; the host's figures are all this layer knows.)
    const int64_t budget = s.budget.load();
    const std::string free = budget > 0 ? fmt::format("{} bytes free of the {} byte budget",
                                                      budget - s.allocated.load(), budget)
                                        : fmt::format("{} bytes available on this machine",
                                                      sample_machine_memory().available_bytes);
    throw_oom(bytes, fmt::format("injected by memory.inject_oom ({}:{}:{}); {}", inj.rank, inj.step,
                                 to_string(inj.phase), free));
  }
}

// Each block carries its size in a header in front of the data, so the deleter needs no lookup.
// LibTorch requires data == context for CPU DataPtrs (raw_allocate checks it), which rules out a
// separate context object. The header keeps the base allocator's alignment.
constexpr size_t kHeader = 64;

class GuardedAllocator final : public c10::Allocator {
 public:
  explicit GuardedAllocator(c10::Allocator* base) {
    base_ = base;
    base_deleter_ = base->raw_deleter();
    TORCH_CHECK(base_deleter_ != nullptr, "the CPU allocator has no raw deleter to wrap");
  }

  c10::DataPtr allocate(size_t n) override {
    State& s = state();
    const auto bytes = static_cast<int64_t>(n);
    maybe_inject(bytes);
    const int64_t budget = s.budget.load();
    const int64_t now = s.allocated.fetch_add(bytes) + bytes;
    if (budget > 0 && now > budget) {
      s.allocated.fetch_sub(bytes);
      throw_oom(bytes, fmt::format("{} bytes free of the {} byte budget (memory.cpu_budget_mb)",
                                   budget - (now - bytes), budget));
    }
    int64_t peak = s.peak.load();
    while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
    }
    auto* base = static_cast<char*>(base_->raw_allocate(n + kHeader));
    *reinterpret_cast<int64_t*>(base) = bytes;
    void* data = base + kHeader;
    return {data, data, &GuardedAllocator::release, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &GuardedAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    state().allocated.fetch_sub(*reinterpret_cast<int64_t*>(base));
    base_deleter_(base);
  }
  static inline c10::Allocator* base_ = nullptr;
  static inline c10::DeleterFnPtr base_deleter_ = nullptr;
};

}  // namespace

CpuAllocatorGuard::CpuAllocatorGuard() {
  // Lives for the whole process: tensors allocated through it may outlive any owner.
  static GuardedAllocator allocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&allocator, /*priority=*/100);
}

CpuAllocatorGuard& CpuAllocatorGuard::instance() {
  static CpuAllocatorGuard guard;
  return guard;
}

void CpuAllocatorGuard::set_budget(int64_t bytes) { state().budget = bytes; }

void CpuAllocatorGuard::set_injections(int rank, std::vector<Injection> injections) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().rank = rank;
  state().armed = !injections.empty();
  state().injections = std::move(injections);
}

void CpuAllocatorGuard::set_phase(int64_t step, Phase phase) {
  state().step = step;
  state().phase = static_cast<int>(phase);
  state().phase_thread = std::this_thread::get_id();
}

int64_t CpuAllocatorGuard::allocated_bytes() const { return state().allocated.load(); }
int64_t CpuAllocatorGuard::peak_bytes() const { return state().peak.load(); }
void CpuAllocatorGuard::reset_peak() { state().peak = state().allocated.load(); }
int64_t CpuAllocatorGuard::budget_bytes() const { return state().budget.load(); }

void CpuAllocatorGuard::check_injection(int64_t bytes) { maybe_inject(bytes); }

}  // namespace memory
