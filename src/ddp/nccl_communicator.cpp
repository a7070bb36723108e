#include "ddp/nccl_communicator.h"

#include <fmt/format.h>

#include "ddp/errors.h"

#if TRAINER_HAVE_CUDA

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <thread>

#include "ddp/check.h"
#include "ddp/desync.h"
#include "ddp/timed_work.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default:
      throw CommError(fmt::format("rank {}: NCCL communicator: unsupported dtype {}",
                                  detail::world_rank_or_unknown(), c10::toString(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op, at::ScalarType t) {
  switch (op) {
    case ReduceOp::kSum: return t == at::kBool ? ncclMax : ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// Owns the NCCL communicator and the communication stream. Non-copyable; the destructor never
// throws (an aborted or failed communicator is aborted rather than destroyed).
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  ~NcclComm() noexcept {
    if (comm_ == nullptr) return;
    if (aborted_) return;
    ncclCommAbort(comm_);  // abort never waits on peers, so shutdown cannot hang
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }

  // Polls the communicator's asynchronous state until it is no longer in progress.
  void wait_ready(Clock::time_point deadline, const std::string& what, int rank) {
    ncclResult_t state = ncclInProgress;
    while (true) {
      TRAINER_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclInProgress) break;
      if (Clock::now() > deadline) {
        abort();
        throw CommTimeout(
            fmt::format("rank {}: NCCL {} did not complete before ddp.timeout_s", rank, what));
      }
      std::this_thread::yield();
    }
    if (state != ncclSuccess) {
      abort();
      throw CommError(
          fmt::format("rank {}: NCCL {} failed: {}", rank, what, ncclGetErrorString(state)));
    }
  }

  void abort() noexcept {
    if (!aborted_ && comm_ != nullptr) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }

 private:
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  bool aborted_ = false;
};

class NcclWork final : public TimedWork {
 public:
  // `record`: the tracker's record of the operation, made before its launch. `done` is recorded on
  // the communication stream after the operation; `keep` holds its tensor as long as the Work
  // lives.
  NcclWork(OpInfo info, const Communicator& owner, std::shared_ptr<desync::Tracker> tracker,
           desync::OpRecord record, std::shared_ptr<NcclComm> comm, cudaEvent_t done,
           at::cuda::CUDAStream caller, at::Tensor keep)
      : TimedWork(std::move(info), owner, std::move(tracker), record), comm_(std::move(comm)),
        done_event_(done), caller_(caller), keep_(std::move(keep)) {}

  ~NcclWork() noexcept override { cudaEventDestroy(done_event_); }

  bool is_completed() override {
    if (done()) return true;
    const cudaError_t q = cudaEventQuery(done_event_);
    if (q == cudaErrorNotReady) {
      ncclResult_t state = ncclSuccess;
      TRAINER_NCCL_CHECK(ncclCommGetAsyncError(comm_->get(), &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        comm_->abort();
        throw CommError(fmt::format("rank {}: NCCL {} at step {} failed: {}", rank(),
                                    info().describe(), step(), ncclGetErrorString(state)));
      }
      return false;
    }
    TRAINER_CUDA_CHECK(q);
    mark_completed();
    // Later work on the caller's stream sees the result.
    TRAINER_CUDA_CHECK(cudaStreamWaitEvent(caller_.stream(), done_event_, 0));
    return true;
  }

 private:
  void pause(Clock::duration /*waiting*/) override { std::this_thread::yield(); }

  std::string on_timeout() override {
    comm_->abort();
    return " NCCL communicator aborted.";
  }

  std::shared_ptr<NcclComm> comm_;
  cudaEvent_t done_event_;
  at::cuda::CUDAStream caller_;
  at::Tensor keep_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, std::chrono::duration<double> timeout)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), device_(device),
        stream_(at::cuda::getStreamFromPool(/*isHighPriority=*/true, device)) {
    timeout_ = timeout;
    c10::cuda::CUDAGuard guard(device_);
    ncclUniqueId id{};
    if (rank_ == 0) TRAINER_NCCL_CHECK(ncclGetUniqueId(&id));
    at::Tensor id_bytes = at::empty({static_cast<int64_t>(sizeof(id))}, at::kByte);
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
    bootstrap.broadcast(id_bytes, 0, "NCCL unique id");
    std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t raw = nullptr;
    TRAINER_NCCL_CHECK(ncclCommInitRankConfig(&raw, size_, id, rank_, &config));
    comm_ = std::make_shared<NcclComm>(raw, device_);
    comm_->wait_ready(Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_),
                      "communicator initialisation", rank_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  WorkPtr all_reduce_async(at::Tensor tensor, ReduceOp op, std::string_view what) override {
    check_tensor(tensor, what);
    return post(tensor,
                OpInfo{desync::all_reduce_kind(op), std::string(what), tensor.numel(),
                       tensor.scalar_type()},
                [&](cudaStream_t s) {
                  return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                       nccl_type(tensor.scalar_type()),
                                       nccl_op(op, tensor.scalar_type()), comm_->get(), s);
                });
  }

  WorkPtr broadcast_async(at::Tensor tensor, int root, std::string_view what) override {
    check_tensor(tensor, what);
    return post(tensor,
                OpInfo{desync::OpKind::kBroadcast, fmt::format("{} from rank {}", what, root),
                       tensor.numel(), tensor.scalar_type()},
                [&](cudaStream_t s) {
                  return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                       nccl_type(tensor.scalar_type()), root, comm_->get(), s);
                });
  }

  WorkPtr all_gather_async(at::Tensor output, at::Tensor input, std::string_view what) override {
    check_tensor(input, what);
    check_tensor(output, what);
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      throw CommError(fmt::format("rank {}: all_gather of {}: output must hold {} x {} elements",
                                  rank_, what, size_, input.numel()));
    }
    // In place when `input` is this rank's block of `output` (NCCL detects it by the pointers).
    c10::cuda::CUDACachingAllocator::recordStream(input.storage().data_ptr(), stream_);
    return post(
        output,
        OpInfo{desync::OpKind::kAllGather, std::string(what), input.numel(), input.scalar_type()},
        [&](cudaStream_t s) {
          return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                               nccl_type(input.scalar_type()), comm_->get(), s);
        });
  }

  WorkPtr reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op,
                               std::string_view what) override {
    check_tensor(input, what);
    check_tensor(output, what);
    if (output.numel() * size_ != input.numel() || output.scalar_type() != input.scalar_type() ||
        (op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
      throw CommError(fmt::format(
          "rank {}: reduce_scatter({}) of {}: input must hold {} x {} elements (sum or avg)", rank_,
          to_string(op), what, size_, output.numel()));
    }
    c10::cuda::CUDACachingAllocator::recordStream(input.storage().data_ptr(), stream_);
    return post(output,
                OpInfo{desync::reduce_scatter_kind(op), std::string(what), input.numel(),
                       input.scalar_type()},
                [&](cudaStream_t s) {
                  return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                           nccl_type(input.scalar_type()),
                                           nccl_op(op, input.scalar_type()), comm_->get(), s);
                });
  }

  WorkPtr barrier_async(std::string_view what) override {
    at::Tensor one =
        at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    return all_reduce_async(one, ReduceOp::kSum, fmt::format("barrier ({})", what));
  }

 private:
  // Dense memory (contiguous, or a permutation such as channels-last) is reduced element by
  // element in memory order, which is the same on every rank for tensors of the same layout.
  void check_tensor(const at::Tensor& t, std::string_view what) const {
    if (!t.is_cuda() || !t.is_non_overlapping_and_dense()) {
      throw CommError(fmt::format("rank {}: NCCL {}: needs a dense CUDA tensor, got {} {}", rank_,
                                  what, t.device().str(),
                                  t.is_non_overlapping_and_dense() ? "dense" : "non-dense"));
    }
  }

  template <class Launch>
  WorkPtr post(const at::Tensor& tensor, OpInfo info, Launch&& launch) {
    c10::cuda::CUDAGuard guard(device_);
    const auto caller = at::cuda::getCurrentCUDAStream(device_);
    cudaEvent_t ready = nullptr;
    cudaEvent_t done = nullptr;
    TRAINER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    TRAINER_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    // The communication stream starts after the work queued so far on the caller's stream.
    TRAINER_CUDA_CHECK(cudaEventRecord(ready, caller.stream()));
    TRAINER_CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), ready, 0));
    cudaEventDestroy(ready);
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream_);
    const desync::OpRecord record = tracker_->post(info.kind, info.what, step_);
    TRAINER_NCCL_CHECK(launch(stream_.stream()));
    comm_->wait_ready(Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_),
                      info.describe(), rank_);
    TRAINER_CUDA_CHECK(cudaEventRecord(done, stream_.stream()));
    // The deadline counts from here, once the launch has returned.
    return std::make_unique<NcclWork>(std::move(info), *this, tracker_, record, comm_, done, caller,
                                      tensor);
  }

  int rank_;
  int size_;
  int device_;
  at::cuda::CUDAStream stream_;
  std::shared_ptr<NcclComm> comm_;
  // This communicator's operations, for the desync diagnosis (ddp/desync.h).
  std::shared_ptr<desync::Tracker> tracker_ = std::make_shared<desync::Tracker>();
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     std::chrono::duration<double> timeout) {
  return std::make_unique<NcclCommunicator>(bootstrap, device, timeout);
}

bool nccl_available() { return true; }

std::string gpu_build() {
  std::string line = fmt::format("CUDA {}.{}, NCCL {}.{}.{}", CUDART_VERSION / 1000,
                                 CUDART_VERSION % 1000 / 10, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int loaded = 0;
  if (ncclGetVersion(&loaded) == ncclSuccess && loaded != NCCL_VERSION_CODE) {
    // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z from NCCL 2.9 on.
    line += fmt::format(" (loaded: {}.{}.{})", loaded / 10000, loaded / 100 % 100, loaded % 100);
  }
  return line;
}

}  // namespace ddp

#else  // !TRAINER_HAVE_CUDA

namespace ddp {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int,
                                                     std::chrono::duration<double>) {
  throw CommError("this trainer was built without CUDA/NCCL; use ddp.backend: mpi");
}

bool nccl_available() { return false; }

std::string gpu_build() { return "CPU only"; }

}  // namespace ddp

#endif
