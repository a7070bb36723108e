// MetricsFile: the run's metrics as JSON Lines (log.metrics), one object per logged step and per
// evaluation, for plots (scripts/plot_metrics.py) and other tools.
//
//   {"type": "step", "step": 50, "epoch": 0.21, "loss": 2.97, "lr": 0.0029, "grad_norm": 0.80,
//    "samples_per_s": 802.0, "tokens_per_s": 51328.0, "micro_batch": 16, "fallbacks": 0,
//    "skipped_steps": 0, "memory_peak_mib": [12.1, 12.3], "wall_s": 3.1}
//   {"type": "eval", "step": 100, "loss": 2.57, "bpb": 1.21, "samples": 256, "wall_s": 5.0,
//    "hellaswag": {"acc": 2871, "acc_norm": 2950, "examples": 10042}}   (one object per eval.tasks)
//
// Only rank 0 writes. A resumed run appends to the same file after dropping the records of steps
// after the checkpoint it resumes from (those steps are trained again), so a step appears once:
// the records kept are written to a temporary file renamed over the old one, so a failure there
// (a full disk) leaves the file as it was. Each record is one line, written with one write(2):
// a killed job loses at most the line in progress (a reader skips it: it has no newline, and a
// resumed run drops it). A record the file system refuses (a full disk) is cut back off the file,
// so the file never holds part of one, and dropped with a warning; training goes on and the next
// record is tried again (docs/reference.md, "Exit codes").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace train {

class MetricsFile {
 public:
  MetricsFile() = default;  // writes nothing
  // Opens `path` for appending, first dropping records whose "step" is above `keep_through`.
  // Throws std::runtime_error naming the file when it cannot be written.
  MetricsFile(const std::string& path, int64_t keep_through);
  ~MetricsFile();
  MetricsFile(MetricsFile&& other) noexcept;
  MetricsFile& operator=(MetricsFile&& other) noexcept;

  bool enabled() const { return fd_ >= 0; }
  // Appends `record` as one line; one the file system refuses is dropped (warned).
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }
  // Records dropped because they could not be written.
  int64_t dropped() const { return dropped_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;     // the file's length: whole records only
  int64_t dropped_ = 0;  // in all
  int64_t failing_ = 0;  // dropped since the last record written
};

// Start-up check (rank 0) that `path` can be appended to; throws std::invalid_argument naming
// log.metrics, so a typo stops the job before step 1 with exit code 2.
void check_metrics_path(const std::string& path);

// The metrics path of a run: log.metrics when set ("off": none), else checkpoint.dir/metrics.jsonl
// when a checkpoint directory is set, else none ("").
std::string metrics_path(const std::string& configured, const std::string& checkpoint_dir);

}  // namespace train
