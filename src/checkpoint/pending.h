// A checkpoint between its two halves (Checkpointer::save and finish, checkpoint/checkpointer.h):
// its host copy taken, its files being written.
#pragma once

#include <cstdint>
#include <future>
#include <string>

#include "io/shard_manifest.h"

namespace checkpoint {

// One rank's write: its vote ("ok BYTES CRC FILE", "nothing" or "error WHY":
// checkpointer.cpp) and how long it took.
struct WriteOutcome {
  std::string vote;
  double seconds = 0;
};

// Why a checkpoint was not written, as every rank finds it in the votes: the worst failure (an
// error before a failure of the disk before a full one; among equals, the lowest rank's).
struct WriteFailure {
  enum Kind { kNone, kFull, kDisk, kOther } kind = kNone;
  std::string message;
};

struct PendingCheckpoint {
  std::string path;  // the file, or the step directory
  std::string tmp;   // its name while being written (the cleanup of unfinished writes keeps it)
  int64_t steps_done = 0;
  bool sharded = false;
  bool may_fail = false;            // periodic: a full disk is a warning (Checkpointer::Need)
  io::ShardManifest manifest;       // sharded: all but the files' sizes and CRC-32s
  double host_copy_s = 0;           // the step's wait: (single-file: the gathers and) the host copy
  std::future<WriteOutcome> write;  // destroyed: waits for the write
};

}  // namespace checkpoint
