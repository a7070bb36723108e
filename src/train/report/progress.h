// Progress: how far rank 0's run is (log.progress). On a terminal, a live bar redrawn by its own
// thread (barkeep): steps done / total, samples/s, the last logged loss and the ETA; the step
// lines (with their ETA) still scroll above it, as the run's history. In a log file (SLURM, or
// anything not a terminal), only the ETA at the end of each step line.
//
//   auto   a bar on rank 0 when stderr is a terminal, else lines. Under mpirun a rank's stderr is
//          a pipe to mpirun, never a terminal: lines.
//   bar    a bar on rank 0 wherever stderr goes (on stdout where stdout is a terminal and stderr
//          is not, as under mpirun, so that the two streams cannot be reordered).
//   lines  step lines with an ETA ("eta 3m12s", from the steady throughput), no bar.
//   off    no bar, step lines without an ETA (as before log.progress existed).
// Other ranks neither draw nor estimate.
//
// Threads: tick() and set_loss() belong to the training thread; the bar's thread only reads what
// they stored (atomics). Nothing here reads the device: tick() is a clock read and a few atomic
// stores, so the bar advances every step without a host sync.
//
// While the bar is up, rank 0's spdlog lines (step lines, warnings, evaluations, memory tables)
// are written above it: see Note [Log lines above the bar] in progress.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace train {

// log.progress, as the config spells it (parsed once by the config loader; train/options.h).
enum class ProgressSetting { kAuto, kBar, kLines, kOff };
inline constexpr std::array<const char*, 4> kProgressSettingNames = {"auto", "bar", "lines", "off"};

enum class ProgressMode { kOff, kLines, kBar };

// log.progress for this rank: auto resolves to kBar on rank 0 when `stderr_is_terminal`, else
// kLines; ranks other than 0 get kOff whatever was asked.
ProgressMode progress_mode(ProgressSetting configured, int rank, bool stderr_is_terminal);

// "45s", "3m12s", "1h02m" (whole seconds, rounded up: an ETA that says 0s is done).
std::string format_duration(double seconds);

class Progress {
 public:
  Progress() = default;  // off
  // Steps [start_step, total_steps) are this run's; a resumed run's bar starts part-filled.
  Progress(ProgressMode mode, int64_t start_step, int64_t total_steps, int64_t global_batch);
  ~Progress();  // takes the bar down (its last frame stays, with a newline) and the log hook off
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  ProgressMode mode() const { return mode_; }

  // Step `step` (1-based, as the logs count) has finished.
  void tick(int64_t step);
  // The loss of the last logged step, shown on the bar.
  void set_loss(double loss);
  // " eta 3m12s" for the step line once a step after this run's first is done; "" before that
  // and when the mode is off.
  std::string eta_suffix() const;

  struct Shared;  // what the bar's thread reads (progress.cpp)

 private:
  struct Bar;  // barkeep and the log hook (progress.cpp)

  ProgressMode mode_ = ProgressMode::kOff;
  int64_t total_ = 0;
  int64_t global_batch_ = 0;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Bar> bar_;
  // The training thread's own bookkeeping: the end of this run's first step (steady throughput
  // is measured from there: the first step carries warm-up) and the samples/s window.
  int64_t first_step_ = -1;
  int64_t first_ns_ = 0;
  int64_t window_step_ = 0;
  int64_t window_ns_ = 0;
  bool window_closed_ = false;
};

}  // namespace train
