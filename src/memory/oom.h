// The job-ending out-of-memory error: every rung of memory.fallback was tried and a step still
// ran out of memory. Every rank throws it at the same point (after the same vote), so the
// launcher can end all ranks cleanly with one message.
#pragma once

#include <stdexcept>

namespace memory {

class OutOfMemoryFatal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memory
