#include "ddp/mpi_communicator.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "ddp/check.h"
#include "ddp/desync.h"
#include "ddp/errors.h"
#include "ddp/kept.h"
#include "ddp/mpi_progress.h"
#include "ddp/timed_work.h"

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

// MPI has no 16-bit float types: bfloat16 and float16 travel as 16-bit words (half the bytes of
// float32, which is the point of ddp.reduce_dtype: bf16) and are reduced by user-defined
// operations that add (or compare) in float32 and round back, as NCCL does for these types.
bool is_16bit_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

template <class T, class Combine>
void combine_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    b[i] = static_cast<T>(Combine{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return std::min(a, b); }
};

// The user-defined operations, created once (after MPI_Init: a communicator exists) and kept
// for the life of the process (MPI_Finalize frees them).
struct Ops16 {
  MPI_Op bf16_sum, bf16_max, bf16_min, half_sum, half_max, half_min;
  Ops16() {
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::BFloat16, Add>, 1, &bf16_sum));
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::BFloat16, Max>, 1, &bf16_max));
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::BFloat16, Min>, 1, &bf16_min));
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::Half, Add>, 1, &half_sum));
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::Half, Max>, 1, &half_max));
    TRAINER_MPI_CHECK(MPI_Op_create(&combine_16bit<c10::Half, Min>, 1, &half_min));
  }
};
const Ops16& ops16() {
  static const Ops16 ops;
  return ops;
}

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
    case at::kBFloat16: return MPI_UINT16_T;
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
  if (is_16bit_float(t)) {
    const Ops16& o = ops16();
    const bool bf16 = t == at::kBFloat16;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return bf16 ? o.bf16_sum : o.half_sum;
      case ReduceOp::kMax: return bf16 ? o.bf16_max : o.half_max;
      case ReduceOp::kMin: return bf16 ? o.bf16_min : o.half_min;
    }
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return t == at::kBool ? MPI_LOR : MPI_SUM;
    case ReduceOp::kMax: return t == at::kBool ? MPI_LOR : MPI_MAX;
    case ReduceOp::kMin: return t == at::kBool ? MPI_LAND : MPI_MIN;
  }
  return MPI_SUM;
}

// The buffer MPI works on: the tensor itself when it is contiguous CPU memory, otherwise a
// contiguous CPU copy that is written back on completion.
at::Tensor staging_buffer(const at::Tensor& t, bool* copy_back) {
  *copy_back = !t.is_cpu() || !t.is_contiguous();
  if (!*copy_back) return t;
  return t.to(at::TensorOptions().device(at::kCPU), /*non_blocking=*/false, /*copy=*/true)
      .contiguous();
}

class MpiWork final : public TimedWork {
 public:
  // `buffer` is what MPI reads and writes; on completion it is divided by `divide_by` (AVG,
  // when > 0) and copied into `user` (when `copy_back`). `keep` stays alive as long as MPI may
  // read it (an all_gather's input). The operation is recorded in the communicator's tracker (null
  // for a communicator that does not span the job) as posted now.
  MpiWork(OpInfo info, const MpiCommunicator& comm, bool yield, at::Tensor buffer, at::Tensor user,
          bool copy_back, int divide_by, at::Tensor keep = {})
      : TimedWork(std::move(info), comm, comm.tracker()), yield_(yield), buffer_(std::move(buffer)),
        user_(std::move(user)), keep_(std::move(keep)), copy_back_(copy_back),
        divide_by_(divide_by) {}

  ~MpiWork() noexcept override {
    // Never wait here: a Work dropped unfinished (an exception unwinding past it, a timed-out
    // peer) could wait forever. MPI forbids freeing an active collective request, and it may
    // still write into the buffers, so both are leaked on purpose; this happens only on the way
    // to ending the process. (A request handed to the progress thread stays with it.)
    if (!done() && (pending_ || request_ != MPI_REQUEST_NULL)) {
      if (!pending_) keep_until_exit(request_);
      keep_until_exit(std::move(buffer_));
      keep_until_exit(std::move(keep_));
    }
  }

  MPI_Request* request() { return &request_; }

  // Called once the operation is posted: the progress thread, where one runs, owns the request
  // from here on (ddp/mpi_progress.h).
  void posted() {
    if (MpiProgress* progress = MpiProgress::running()) pending_ = progress->track(request_);
  }

  bool is_completed() override {
    if (done()) return true;
    if (pending_) {
      if (pending_->done.load(std::memory_order_acquire)) complete_handed_over();
      return done();
    }
    int flag = 0;
    TRAINER_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    if (flag) complete();
    return done();
  }

  void wait() override {
    if (done()) return;  // is_completed() saw it complete
    if (!pending_) {
      TimedWork::wait();  // polls MPI_Test (Open MPI progresses only inside MPI calls)
      return;
    }
    // The progress thread tests the request; this thread sleeps until it is done.
    if (!MpiProgress::running()->wait_until(*pending_, deadline())) timed_out(Clock::now());
    complete_handed_over();
  }

 private:
  // Yield the core between polls only where ranks outnumber cores (as Open MPI does), since
  // yielding costs ~5% bandwidth on 1-4 MB buffers (bench/RESULTS.md). Only a wait that has lasted
  // seconds (a slow or stalled peer) backs off to sleeping, so it does not burn a core until the
  // deadline.
  void pause(Clock::duration waiting) override {
    if (waiting < std::chrono::seconds(2)) {
      if (yield_) std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void complete_handed_over() {
    TRAINER_MPI_CHECK(pending_->error);
    complete();
  }

  void complete() {
    mark_completed();
    if (divide_by_ > 0) buffer_.div_(divide_by_);
    if (copy_back_) user_.copy_(buffer_);
  }

  bool yield_;
  at::Tensor buffer_;
  at::Tensor user_;
  at::Tensor keep_;
  bool copy_back_;
  int divide_by_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::shared_ptr<PendingRequest> pending_;  // set when the progress thread owns the request
};

// The job's ranks on this node (MpiTopology::local_size), for every communicator of the process.
std::atomic<int> g_ranks_on_node{1};

}  // namespace

void MpiCommunicator::set_ranks_on_node(int ranks) { g_ranks_on_node = ranks; }

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::chrono::duration<double> timeout,
                                 bool tracked) {
  TRAINER_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  TRAINER_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  TRAINER_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TRAINER_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  timeout_ = timeout;
  oversubscribed_ = g_ranks_on_node.load() > static_cast<int>(std::thread::hardware_concurrency());
  // Only a communicator over every rank of the job, or one of the same role on every rank, can be
  // compared across ranks.
  int same = MPI_UNEQUAL;
  TRAINER_MPI_CHECK(MPI_Comm_compare(comm_, MPI_COMM_WORLD, &same));
  if (same == MPI_CONGRUENT || tracked) tracker_ = std::make_shared<desync::Tracker>();
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
  bool copy_back = false;
  at::Tensor buffer = staging_buffer(tensor, &copy_back);
  const auto dtype = buffer.scalar_type();
  const auto count = static_cast<int>(buffer.numel());
  void* data = buffer.data_ptr();
  auto work = std::make_unique<MpiWork>(
      OpInfo{desync::all_reduce_kind(op), std::string(what), tensor.numel(), tensor.scalar_type()},
      *this, oversubscribed_, std::move(buffer), tensor, copy_back,
      op == ReduceOp::kAvg ? size_ : 0);
  TRAINER_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, mpi_type(dtype), mpi_op(op, dtype),
                                   comm_, work->request()));
  work->posted();
  return work;
}

WorkPtr MpiCommunicator::broadcast_async(at::Tensor tensor, int root, std::string_view what) {
  bool copy_back = false;
  at::Tensor buffer = staging_buffer(tensor, &copy_back);
  const auto dtype = buffer.scalar_type();
  const auto count = static_cast<int>(buffer.numel());
  void* data = buffer.data_ptr();
  auto work = std::make_unique<MpiWork>(
      OpInfo{desync::OpKind::kBroadcast, fmt::format("{} from rank {}", what, root), tensor.numel(),
             tensor.scalar_type()},
      *this, oversubscribed_, std::move(buffer), tensor, copy_back, 0);
  TRAINER_MPI_CHECK(MPI_Ibcast(data, count, mpi_type(dtype), root, comm_, work->request()));
  work->posted();
  return work;
}

namespace {
// Whether `input` is rank `rank`'s block of `output` (an in-place all-gather).
bool is_own_block(const at::Tensor& output, const at::Tensor& input, int rank) {
  return input.is_contiguous() && output.is_contiguous() &&
         input.storage().is_alias_of(output.storage()) &&
         input.storage_offset() == output.storage_offset() + rank * input.numel();
}
}  // namespace

WorkPtr MpiCommunicator::all_gather_async(at::Tensor output, at::Tensor input,
                                          std::string_view what) {
  if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
    throw CommError(fmt::format(
        "rank {}: all_gather of {}: output must hold {} x {} elements of {}, has {} of {}", rank_,
        what, size_, input.numel(), c10::toString(input.scalar_type()), output.numel(),
        c10::toString(output.scalar_type())));
  }
  // In place: the staged output (or the output itself) already holds this rank's block.
  const bool in_place = is_own_block(output, input, rank_);
  bool in_copied = false;
  bool out_copy_back = false;
  at::Tensor in = in_place ? at::Tensor() : staging_buffer(input, &in_copied);
  at::Tensor out = staging_buffer(output, &out_copy_back);
  const auto type = mpi_type(output.scalar_type());
  const int count = static_cast<int>(input.numel());
  const void* in_data = in_place ? MPI_IN_PLACE : in.data_ptr();
  void* out_data = out.data_ptr();
  auto work = std::make_unique<MpiWork>(
      OpInfo{desync::OpKind::kAllGather, std::string(what), input.numel(), input.scalar_type()},
      *this, oversubscribed_, std::move(out), output, out_copy_back, 0, std::move(in));
  TRAINER_MPI_CHECK(
      MPI_Iallgather(in_data, count, type, out_data, count, type, comm_, work->request()));
  work->posted();
  return work;
}

WorkPtr MpiCommunicator::reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op,
                                              std::string_view what) {
  if (output.numel() * size_ != input.numel() || output.scalar_type() != input.scalar_type() ||
      (op != ReduceOp::kSum && op != ReduceOp::kAvg) ||
      (op == ReduceOp::kAvg && !at::isFloatingType(input.scalar_type()))) {
    throw CommError(fmt::format(
        "rank {}: reduce_scatter({}) of {}: input must hold {} x {} elements of {} and the "
        "operation be sum (or avg of floating point); got {} of {}",
        rank_, to_string(op), what, size_, output.numel(), c10::toString(output.scalar_type()),
        input.numel(), c10::toString(input.scalar_type())));
  }
  bool in_copied = false;
  bool out_copy_back = false;
  at::Tensor in = staging_buffer(input, &in_copied);
  at::Tensor out = staging_buffer(output, &out_copy_back);
  const auto dtype = in.scalar_type();
  const int count = static_cast<int>(output.numel());
  const void* in_data = in.data_ptr();
  void* out_data = out.data_ptr();
  auto work =
      std::make_unique<MpiWork>(OpInfo{desync::reduce_scatter_kind(op), std::string(what),
                                       input.numel(), input.scalar_type()},
                                *this, oversubscribed_, std::move(out), output, out_copy_back,
                                op == ReduceOp::kAvg ? size_ : 0, std::move(in));
  // The 16-bit float types use the same user-defined sum as the all-reduce (mpi_op).
  TRAINER_MPI_CHECK(MPI_Ireduce_scatter_block(in_data, out_data, count, mpi_type(dtype),
                                              mpi_op(op, dtype), comm_, work->request()));
  work->posted();
  return work;
}

WorkPtr MpiCommunicator::barrier_async(std::string_view what) {
  auto work =
      std::make_unique<MpiWork>(OpInfo{desync::OpKind::kBarrier, std::string(what), 0, at::kByte},
                                *this, oversubscribed_, at::Tensor(), at::Tensor(), false, 0);
  TRAINER_MPI_CHECK(MPI_Ibarrier(comm_, work->request()));
  work->posted();
  return work;
}

}  // namespace ddp
