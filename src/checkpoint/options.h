// The checkpoint section of the config (declared with its defaults in config/schema_train.cpp,
// the one place for defaults: the initialisers here are only zero values).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace checkpoint {

// checkpoint.format: auto (sharded when ddp.shard is configured not none), sharded (a step
// directory, every rank writes its shard: checkpoint/sharded.h) or single (one file, rank 0
// writes: checkpoint/single_file.h).
enum class Format { kAuto, kSharded, kSingle };
inline constexpr std::array<const char*, 3> kFormatNames = {"auto", "sharded", "single"};

struct CheckpointOptions {
  std::string dir;        // empty: no checkpoints
  int64_t every = 0;      // 0: only at the end
  std::string resume;     // a checkpoint file, "auto" (the latest in dir, if any) or empty
  int64_t keep_last = 0;  // periodic checkpoints kept (0: all)
  Format format{};
  // The step waits only for the copy to host memory; a background thread writes and fsyncs, and
  // the next checkpoint (or the end of the run) waits for it and commits it
  // (checkpoint/checkpointer.h).
  bool async = false;
  // Periodic checkpoints that may fail in a row for want of space before the job stops (exit
  // code 5); the final checkpoint and the ones that end a job may not fail.
  int64_t max_failed_writes = 0;
};

}  // namespace checkpoint
