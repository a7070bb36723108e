// TimedWork: what every backend's Work shares. It knows what the operation is (for messages), its
// deadline (ddp.timeout_s, counted from when the Work was made), and its record in the
// communicator's desync tracker (ddp/desync.h); it turns a missed deadline into CommTimeout with
// the desync diagnosis, and polls until completion.
//
// A backend's Work (MpiWork in mpi_communicator.cpp, NcclWork in nccl_communicator.cpp) adds how
// to test for completion (is_completed(), which calls mark_completed() once), how to pause between
// polls, and what to do on a timeout before the error is thrown (NCCL aborts its communicator).
// Used from one thread at a time, like its Communicator.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/communicator.h"
#include "ddp/desync.h"

namespace ddp {

// What an operation is, for messages; formatted only when one is needed (a timeout, an error).
struct OpInfo {
  desync::OpKind kind = desync::OpKind::kNone;
  std::string what;  // the caller's `what` ("bucket 3"), and the root of a broadcast
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;

  // "all_reduce(sum) of bucket 3 (1048576 x Float)".
  std::string describe() const;
};

class TimedWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;

  // Polls is_completed(), calling pause() between polls; past the deadline, on_timeout() and then
  // CommTimeout.
  void wait() override;

  const OpInfo& info() const { return info_; }

 protected:
  // Records the operation in `tracker` as posted now (a null tracker: a communicator that does not
  // span the job, nothing is recorded) and starts the clock. `comm` gives the rank, the step and
  // the deadline.
  TimedWork(OpInfo info, const Communicator& comm, std::shared_ptr<desync::Tracker> tracker);
  // The same for an operation `tracker` already recorded as `record` (NCCL records it before the
  // launch and starts the clock once the launch has returned).
  TimedWork(OpInfo info, const Communicator& comm, std::shared_ptr<desync::Tracker> tracker,
            desync::OpRecord record);

  // Between two polls of wait(); `waiting`: how long this wait() has lasted so far.
  virtual void pause(Clock::duration waiting) = 0;
  // Called once a wait has passed the deadline, before CommTimeout is thrown; returns a sentence
  // for the message (" NCCL communicator aborted.") or nothing.
  virtual std::string on_timeout() { return {}; }

  bool done() const { return done_; }
  // Called once, by is_completed(), when the operation has completed: records it in the tracker.
  void mark_completed() noexcept;
  Clock::time_point deadline() const;
  // Throws the CommTimeout of a wait that noticed the missed deadline at `now`, after on_timeout().
  [[noreturn]] void timed_out(Clock::time_point now);

  int rank() const { return rank_; }
  int64_t step() const { return step_; }

 private:
  OpInfo info_;
  int64_t step_;
  int rank_;
  std::chrono::duration<double> timeout_;
  std::shared_ptr<desync::Tracker> tracker_;
  desync::OpRecord record_;
  Clock::time_point posted_;
  bool done_ = false;
};

}  // namespace ddp
