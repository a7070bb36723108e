// The two out-of-memory errors that end a job (the recoverable one, c10::OutOfMemoryError in
// forward or backward, never leaves the Trainer).
#pragma once

#include <stdexcept>

namespace memory {

// Agreed: every rank throws it at the same point, after the same vote (every rung of
// memory.fallback spent, or persistent state that does not fit before step 1), so the launcher
// can end all ranks cleanly with one message and exit code 4.
class OutOfMemoryFatal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One rank only, where no vote can follow (the optimizer step, after the status vote, which
// allocates nothing by design): the other ranks are already in the next step's collectives, so
// the launcher aborts the whole job with exit code 4 instead of waiting for them.
class OutOfMemoryAbort : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memory
