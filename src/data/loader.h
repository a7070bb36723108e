// Loader: reads the batches of the coming steps on background threads, so the training step
// never waits on reading or decoding (docs/DESIGN.md, "Data pipeline").
//
// Contract:
// - `indices_of(step)` gives this rank's dataset indices of a step (the RankSampler's slice; the
//   loader knows nothing of ranks). It is called under the loader's lock, one step at a time in
//   increasing step order, and its result is copied, so it may return a view that a later call
//   overwrites.
// - get(step) returns the batch of `step` (dataset.get(indices_of(step))): exactly what a
//   synchronous read would give, whatever the number of workers. Steps are asked for in
//   increasing order; asking again for the step last returned gives the same batch (a step
//   re-run after an out-of-memory fallback). Asking for an earlier step, or skipping ahead,
//   restarts the read-ahead there.
// - With workers > 0, up to `prefetch` steps after the one last asked for are read ahead by
//   `workers` threads (each reads whole steps). With workers = 0 get() reads in the caller.
// - pin_memory: batches are returned in page-locked host memory (for non_blocking copies to a
//   GPU); requires a CUDA build and a GPU.
// - An exception in a worker (a malformed file, out of memory) is rethrown by the get() of that
//   step, in the training thread.
// - read_delay_ms (test hook, data.inject_read_delay_ms): every step's read sleeps this long
//   first, as on a slow file system.
// - The destructor stops and joins the workers (a read in progress finishes first).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace data {

// Built from data.workers, data.prefetch and data.inject_read_delay_ms, whose defaults the config
// schema declares; name the fields where you build one (LoaderOptions{.workers = 2, ...}).
struct LoaderOptions {
  int64_t workers = 0;
  int64_t prefetch = 0;  // below 1: 1
  int64_t read_delay_ms = 0;
  bool pin_memory = false;
};

class Loader {
 public:
  Loader(const Dataset& dataset, std::function<at::Tensor(int64_t step)> indices_of,
         LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  Batch get(int64_t step);

  // Host bytes of the batches the loader may hold at once: (prefetch + 1) steps of
  // `step_bytes` each (the one in use and those read ahead).
  static int64_t buffer_bytes(const LoaderOptions& options, int64_t step_bytes);
  // Seconds get() has spent waiting for a batch that was not read yet (the time a step waited
  // on data), and the reads so far (each step's once, re-reads after a restart included).
  double waited_s() const { return waited_s_; }
  int64_t reads() const { return reads_; }
  const LoaderOptions& options() const { return options_; }

 private:
  struct Slot {
    bool done = false;
    Batch batch;
    std::exception_ptr error;
  };

  Batch read(const at::Tensor& indices) const;
  void work();
  void restart_locked(int64_t step);

  const Dataset& dataset_;
  std::function<at::Tensor(int64_t)> indices_of_;
  LoaderOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_workers_;
  std::condition_variable wake_consumer_;
  std::map<int64_t, Slot> slots_;  // steps scheduled or read, not yet consumed
  int64_t current_ = -1;           // the step last returned by get()
  int64_t next_to_schedule_ = 0;
  Batch current_batch_;
  bool stopping_ = false;
  double waited_s_ = 0;  // consumer thread only
  mutable std::atomic<int64_t> reads_{0};
  std::vector<std::thread> threads_;
};

// Micro-batch [offset, offset + n) of `batch` on `device`: on CUDA copied from (pinned) host
// memory on a side stream with non_blocking copies, the current (compute) stream waiting for the
// copy and the allocator told the memory is used there; on the CPU a view.
Batch to_device(const Batch& batch, int64_t offset, int64_t n, c10::Device device);

}  // namespace data
