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
// after the checkpoint it resumes from (those steps are trained again), so a step appears once.
// Each record is one line, flushed as written: a killed job loses at most the line in progress.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

namespace train {

class MetricsFile {
 public:
  MetricsFile() = default;  // writes nothing
  // Opens `path` for appending, first dropping records whose "step" is above `keep_through`.
  // Throws std::runtime_error naming the file when it cannot be written.
  MetricsFile(const std::string& path, int64_t keep_through);

  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Start-up check (rank 0) that `path` can be appended to; throws std::invalid_argument naming
// log.metrics, so a typo stops the job before step 1 with exit code 2.
void check_metrics_path(const std::string& path);

// The metrics path of a run: log.metrics when set ("off": none), else checkpoint.dir/metrics.jsonl
// when a checkpoint directory is set, else none ("").
std::string metrics_path(const std::string& configured, const std::string& checkpoint_dir);

}  // namespace train
