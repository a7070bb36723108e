// keep_until_exit: memory that MPI may still read or write after its owner is gone (the buffers
// of a collective abandoned on a timeout, the desync exchange's messages: ddp/mpi_communicator.cpp,
// ddp/desync.cpp). It must never be freed; held here, it stays reachable until the process ends,
// so that LeakSanitizer (scripts/sanitize.sh address) does not report it as a leak.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace ddp {

// Moves `value` into storage that is never freed, and returns it there.
template <class T>
T& keep_until_exit(T value) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<T>>();  // never destroyed, on purpose
  auto held = std::make_shared<T>(std::move(value));
  const std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(held);
  return *held;
}

}  // namespace ddp
