#include "ddp/mpi_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <thread>

#include "ddp/check.h"
#include "ddp/errors.h"

namespace ddp {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// MPI has no 16-bit float types: those travel as float32 and are converted back on completion.
bool needs_upcast(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    default:
      throw CommError(fmt::format("rank {}: MPI communicator: unsupported dtype {}",
                                  detail::world_rank_or_unknown(), c10::toString(t)));
  }
}

MPI_Op mpi_op(ReduceOp op, at::ScalarType t) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return t == at::kBool ? MPI_LOR : MPI_SUM;
    case ReduceOp::kMax: return t == at::kBool ? MPI_LOR : MPI_MAX;
    case ReduceOp::kMin: return t == at::kBool ? MPI_LAND : MPI_MIN;
  }
  return MPI_SUM;
}

// The buffer MPI works on: the tensor itself when it is contiguous CPU memory of an MPI type,
// otherwise a contiguous CPU copy that is written back on completion.
struct Staged {
  at::Tensor user;
  at::Tensor buffer;
  bool copy_back = false;
};

Staged stage(const at::Tensor& t) {
  Staged s{t, t, false};
  if (!t.is_cpu() || !t.is_contiguous() || needs_upcast(t.scalar_type())) {
    auto dtype = needs_upcast(t.scalar_type()) ? at::kFloat : t.scalar_type();
    s.buffer = t.to(at::TensorOptions().device(at::kCPU).dtype(dtype),
                    /*non_blocking=*/false, /*copy=*/true)
                   .contiguous();
    s.copy_back = true;
  }
  return s;
}

class MpiWork final : public Work {
 public:
  MpiWork(std::string what, int64_t step, int rank, std::chrono::duration<double> timeout,
          std::function<void()> on_complete)
      : what_(std::move(what)), step_(step), rank_(rank), timeout_(timeout),
        posted_(Clock::now()), on_complete_(std::move(on_complete)) {}

  ~MpiWork() noexcept override {
    // Never wait here: a Work dropped unfinished (an exception unwinding past it, a timed-out
    // peer) could wait forever. MPI forbids freeing an active collective request, and it may
    // still write into the buffers, so both are leaked on purpose; this happens only on the way
    // to ending the process.
    if (!done_ && request_ != MPI_REQUEST_NULL) {
      new MPI_Request(request_);
      new std::function<void()>(std::move(on_complete_));
    }
  }

  MPI_Request* request() { return &request_; }

  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    TRAINER_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    if (flag) complete();
    return done_;
  }

  void wait() override {
    // Spin briefly (latency), then yield (ranks may share cores), then sleep (a long wait
    // for a slow peer should not burn a core).
    for (int64_t polls = 0; !is_completed(); ++polls) {
      const auto waited = Clock::now() - posted_;
      if (waited > timeout_) {
        throw CommTimeout(fmt::format(
            "rank {}: {} did not complete at step {}: waited {:.1f} s, past ddp.timeout_s = {:.0f} "
            "s. Another rank is stalled, dead, or issuing different collectives.",
            rank_, what_, step_, std::chrono::duration<double>(waited).count(),
            timeout_.count()));
      }
      if (polls < 1000) continue;
      if (waited < std::chrono::milliseconds(50)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

 private:
  void complete() {
    done_ = true;
    if (on_complete_) on_complete_();
  }

  std::string what_;
  int64_t step_;
  int rank_;
  std::chrono::duration<double> timeout_;
  Clock::time_point posted_;
  std::function<void()> on_complete_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::duration<double> timeout) {
  TRAINER_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  TRAINER_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  TRAINER_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TRAINER_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  timeout_ = timeout;
}

MpiCommunicator::~MpiCommunicator() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(
    std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(comm_, timeout);
}

WorkPtr MpiCommunicator::all_reduce_async(at::Tensor tensor, ReduceOp op, std::string_view what) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
    throw CommError(fmt::format("rank {}: all_reduce(avg) needs a floating-point tensor, got {}",
                                rank_, c10::toString(tensor.scalar_type())));
  }
  auto s = std::make_shared<Staged>(stage(tensor));
  const int world = size_;
  auto work = std::make_unique<MpiWork>(
      fmt::format("all_reduce({}) of {} ({} x {})", to_string(op), what, s->buffer.numel(),
                  c10::toString(tensor.scalar_type())),
      step_, rank_, timeout_, [s, op, world] {
        if (op == ReduceOp::kAvg) s->buffer.div_(world);
        if (s->copy_back) s->user.copy_(s->buffer);
      });
  const auto dtype = s->buffer.scalar_type();
  TRAINER_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, s->buffer.data_ptr(),
                                   static_cast<int>(s->buffer.numel()), mpi_type(dtype),
                                   mpi_op(op, dtype), comm_, work->request()));
  return work;
}

WorkPtr MpiCommunicator::broadcast_async(at::Tensor tensor, int root, std::string_view what) {
  auto s = std::make_shared<Staged>(stage(tensor));
  auto work = std::make_unique<MpiWork>(
      fmt::format("broadcast from rank {} of {}", root, what), step_, rank_, timeout_,
      [s] {
        if (s->copy_back) s->user.copy_(s->buffer);
      });
  TRAINER_MPI_CHECK(MPI_Ibcast(s->buffer.data_ptr(), static_cast<int>(s->buffer.numel()),
                               mpi_type(s->buffer.scalar_type()), root, comm_, work->request()));
  return work;
}

WorkPtr MpiCommunicator::all_gather_async(at::Tensor output, at::Tensor input,
                                          std::string_view what) {
  if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
    throw CommError(fmt::format(
        "rank {}: all_gather of {}: output must hold {} x {} elements of {}, has {} of {}", rank_,
        what, size_, input.numel(), c10::toString(input.scalar_type()), output.numel(),
        c10::toString(output.scalar_type())));
  }
  auto in = std::make_shared<Staged>(stage(input));
  auto out = std::make_shared<Staged>(stage(output));
  auto work = std::make_unique<MpiWork>(fmt::format("all_gather of {}", what), step_, rank_,
                                        timeout_, [in, out] {
                                          if (out->copy_back) out->user.copy_(out->buffer);
                                        });
  const auto type = mpi_type(in->buffer.scalar_type());
  const int count = static_cast<int>(in->buffer.numel());
  TRAINER_MPI_CHECK(MPI_Iallgather(in->buffer.data_ptr(), count, type, out->buffer.data_ptr(),
                                   count, type, comm_, work->request()));
  return work;
}

WorkPtr MpiCommunicator::barrier_async(std::string_view what) {
  auto work = std::make_unique<MpiWork>(fmt::format("barrier ({})", what), step_, rank_,
                                        timeout_, nullptr);
  TRAINER_MPI_CHECK(MPI_Ibarrier(comm_, work->request()));
  return work;
}

}  // namespace ddp
