// MpiProgress: a thread that drives this process's non-blocking MPI operations to completion
// while the training thread computes.
//
// Open MPI moves a non-blocking collective (MPI_Iallreduce, ...) forward only inside MPI calls,
// on whichever thread makes them ("OMPI progress: no" in ompi_info). Without a helper, a bucket
// posted from a backward hook waits until backward ends and the training thread tests it: the
// all-reduce overlaps nothing. With MPI_THREAD_MULTIPLE, this thread owns each posted request
// from then on: it tests its requests (MPI_Test is where Open MPI copies the fragments and runs
// the collective's next round) every `poll` interval while any are pending and the training
// thread computes, back to back while the training thread waits for one, and sleeps on a
// condition variable when none are pending. The training thread never tests a request it handed
// over (MPI forbids testing one request from two threads); it reads the request's `done` flag or
// waits for it on the condition variable, with its own deadline.
//
// Contract: start() once, after MPI_Init_thread provided MPI_THREAD_MULTIPLE; stop() before
// MPI_Finalize (MpiRuntime does both). A request whose waiter gave up (a timeout) stays with the
// thread until stop(): MPI forbids freeing an active collective request, and the job is ending.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp {

// One posted operation, shared by its Work (the waiter) and the progress thread.
struct PendingRequest {
  MPI_Request request = MPI_REQUEST_NULL;
  std::atomic<bool> done{false};
  int error = MPI_SUCCESS;  // MPI_Test's return code, when it failed
};

class MpiProgress {
 public:
  // The process's progress thread, or nullptr when it is not running (not started, stopped, or
  // MPI without MPI_THREAD_MULTIPLE): then each Work tests its own request.
  static MpiProgress* running();

  // Starts the thread. `poll`: the pause between rounds of MPI_Test while requests are pending.
  static void start(std::chrono::microseconds poll);
  static void stop() noexcept;

  // Hands a posted request to the thread; `request` must not be tested by the caller afterwards.
  std::shared_ptr<PendingRequest> track(MPI_Request request);

  // Blocks until `p` is done or `deadline` passes; true when done.
  bool wait_until(const PendingRequest& p, std::chrono::steady_clock::time_point deadline);

  ~MpiProgress();

 private:
  explicit MpiProgress(std::chrono::microseconds poll);
  void loop();

  std::chrono::microseconds poll_;
  std::mutex mutex_;
  std::condition_variable work_;                          // new requests, or stop
  std::condition_variable done_;                          // some request completed
  std::vector<std::shared_ptr<PendingRequest>> pending_;  // under mutex_
  bool stop_ = false;                                     // under mutex_
  std::atomic<int> waiters_{0};  // training threads blocked in wait_until: poll without pausing
  std::thread thread_;
};

}  // namespace ddp
