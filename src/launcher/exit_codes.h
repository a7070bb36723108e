// The trainer's exit codes.
#pragma once

namespace launcher {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // an internal or runtime failure
inline constexpr int kExitUsage = 2;        // a user mistake: command line, config, launch, data
inline constexpr int kExitTimeout = 3;      // a collective missed ddp.timeout_s
inline constexpr int kExitOutOfMemory = 4;  // out of memory: fallbacks spent, or state too big
inline constexpr int kExitDisk = 5;  // a checkpoint could not be written (disk full, I/O error)
// Stopped by a signal after a checkpoint: 128 + the signal number, as shells report it.

}  // namespace launcher
