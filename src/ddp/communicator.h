// Communicator: collectives on tensors across the ranks of one job.
//
// Contract (as in c10d's ProcessGroup): every rank calls the same operations, on tensors of the
// same shape and dtype, in the same order. Operations are asynchronous: the *_async calls post
// the operation and return a Work handle; the blocking forms post and wait. A Work that has not
// completed within the communicator's deadline (ddp.timeout_s, counted from when it was posted)
// throws CommTimeout from wait(): a stalled peer ends the job instead of hanging it.
//
// Tensors are reduced in place; the caller keeps them alive and untouched until wait() returns.
// A Communicator is used from one thread at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ddp {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
std::string_view to_string(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // Non-blocking; also drives progress of the operation.
  virtual bool is_completed() = 0;
  // Blocks until completion; throws CommTimeout past the deadline, CommError on failure.
  virtual void wait() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  // `what` names the operation in timeout and error messages ("bucket 3", "status vote").
  [[nodiscard]] virtual WorkPtr all_reduce_async(at::Tensor tensor, ReduceOp op,
                                                 std::string_view what) = 0;
  [[nodiscard]] virtual WorkPtr broadcast_async(at::Tensor tensor, int root,
                                                std::string_view what) = 0;
  // `output` holds size() blocks the shape of `input`, concatenated along dim 0. In place when
  // `input` is this rank's block of `output` (the same memory: output[rank * n, (rank + 1) * n)).
  [[nodiscard]] virtual WorkPtr all_gather_async(at::Tensor output, at::Tensor input,
                                                 std::string_view what) = 0;
  // `input` holds size() blocks of output.numel() elements; rank r's `output` receives the
  // reduction over ranks of block r (ZeRO's gradient reduce-scatter). Both contiguous, distinct
  // memory, one dtype; kSum and kAvg only.
  [[nodiscard]] virtual WorkPtr reduce_scatter_async(at::Tensor output, at::Tensor input,
                                                     ReduceOp op, std::string_view what) = 0;
  [[nodiscard]] virtual WorkPtr barrier_async(std::string_view what) = 0;

  void all_reduce(at::Tensor tensor, ReduceOp op, std::string_view what = "all_reduce") {
    all_reduce_async(std::move(tensor), op, what)->wait();
  }
  void broadcast(at::Tensor tensor, int root, std::string_view what = "broadcast") {
    broadcast_async(std::move(tensor), root, what)->wait();
  }
  void all_gather(at::Tensor output, at::Tensor input, std::string_view what = "all_gather") {
    all_gather_async(std::move(output), std::move(input), what)->wait();
  }
  void reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op,
                      std::string_view what = "reduce_scatter") {
    reduce_scatter_async(std::move(output), std::move(input), op, what)->wait();
  }
  void barrier(std::string_view what = "barrier") { barrier_async(what)->wait(); }

  // The training step the next operations belong to, for messages only (-1: start-up).
  void set_step(int64_t step) { step_ = step; }
  // "at step N", or "during start-up (before step 1)" for operations before any step.
  static std::string when(int64_t step) {
    return step >= 1 ? "at step " + std::to_string(step) : "during start-up (before step 1)";
  }
  int64_t step() const { return step_; }

  std::chrono::duration<double> timeout() const { return timeout_; }
  void set_timeout(std::chrono::duration<double> timeout) { timeout_ = timeout; }

 protected:
  int64_t step_ = -1;
  std::chrono::duration<double> timeout_{600.0};
};

}  // namespace ddp
