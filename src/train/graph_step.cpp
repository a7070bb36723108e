#include "train/graph_step.h"

#include "core/error_text.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <vector>

#ifdef TRAINER_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace train {

#ifdef TRAINER_HAVE_CUDA

struct GraphStep::Graphs {
  struct Captured {
    at::cuda::CUDAGraph graph;
    at::Tensor inputs;  // static: each replay's micro-batch is copied in
    at::Tensor targets;
  };
  // Key: the input and target shapes and dtypes.
  std::map<std::vector<int64_t>, std::unique_ptr<Captured>> by_shape;
};

namespace {
std::vector<int64_t> shape_key(const at::Tensor& inputs, const at::Tensor& targets) {
  std::vector<int64_t> key(inputs.sizes().begin(), inputs.sizes().end());
  key.push_back(-1 - static_cast<int64_t>(inputs.scalar_type()));
  key.insert(key.end(), targets.sizes().begin(), targets.sizes().end());
  key.push_back(-1 - static_cast<int64_t>(targets.scalar_type()));
  return key;
}

// Ends a capture that an exception interrupted, so the stream and the allocator leave capture
// mode (CUDAGraph::capture_end would throw on the invalidated capture before releasing its pool,
// and CUDAGraph::pool() throws before a capture ended: the pool is the caller's own handle).
void abandon_capture(c10::MempoolId_t pool, const at::cuda::CUDAStream& stream,
                     c10::Device device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream.stream(), &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
  }
  cudaGetLastError();  // clear the sticky-free error the interrupted capture left
  c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool);
  c10::cuda::CUDACachingAllocator::releasePool(device.index(), pool);
}

// Records `body` on the static buffers `inputs` / `targets` into `graph`, on a side stream that
// starts after the work queued so far. An out-of-memory error propagates (the step's OOM: the
// protocol falls back, invalidate() follows); another failure is returned (its first line), and
// then nothing ran.
std::optional<std::string> capture(at::cuda::CUDAGraph& graph, const at::Tensor& inputs,
                                   const at::Tensor& targets, c10::Device device,
                                   const GraphStep::Body& body) {
  c10::cuda::CUDAGuard device_guard(device);
  // Capture must not run on the default stream; the side stream starts after the work queued so
  // far on the current one (the static buffers' copies).
  const auto current = at::cuda::getCurrentCUDAStream(device.index());
  const auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  cudaEvent_t queued = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(queued, current.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(side.stream(), queued, 0));
  cudaEventDestroy(queued);
  graph.register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  // Autocast's cast cache would hand the graph tensors cast outside it.
  const bool cache = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  std::optional<std::string> failure;
  try {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    // Thread-local mode: the loader's workers may allocate pinned memory meanwhile; backward
    // kernels launched by autograd's device thread onto this stream are captured all the same.
    const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
    graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      body(inputs, targets);
      graph.capture_end();
    } catch (...) {
      abandon_capture(pool, side, device);
      throw;
    }
  } catch (const c10::OutOfMemoryError&) {
    at::autocast::set_autocast_cache_enabled(cache);
    throw;
  } catch (const std::exception& e) {
    failure = core::first_line(e.what());
  }
  at::autocast::set_autocast_cache_enabled(cache);
  return failure;
}

}  // namespace

#else

struct GraphStep::Graphs {};

#endif

GraphStep::GraphStep(bool requested, c10::Device device, int64_t warmup_steps, bool log)
    : requested_(requested), device_(device), warmup_steps_(warmup_steps), log_(log),
      graphs_(std::make_unique<Graphs>()) {
  if (!requested_) return;
#ifndef TRAINER_HAVE_CUDA
  disable("this trainer was built without CUDA");
#else
  if (!device_.is_cuda()) disable("they need a CUDA device (train.device is CPU)");
#endif
}

GraphStep::~GraphStep() = default;

void GraphStep::say(const std::string& message) {
  if (log_ && message != last_said_) spdlog::warn("{}", message);
  last_said_ = message;
}

void GraphStep::disable(const std::string& why) {
  if (!disabled_reason_.empty()) return;
  disabled_reason_ = why;
  say(fmt::format("train.cuda_graphs: training eagerly for the rest of the run: {}", why));
#ifdef TRAINER_HAVE_CUDA
  graphs_->by_shape.clear();
#endif
}

void GraphStep::invalidate(const std::string& why) {
#ifdef TRAINER_HAVE_CUDA
  if (graphs_->by_shape.empty()) return;
  graphs_->by_shape.clear();
  say(fmt::format("train.cuda_graphs: graphs dropped ({}); the next step captures anew", why));
#endif
}

bool GraphStep::use_for_step(const std::string& why_not) {
  if (!requested_ || disabled()) return false;
  if (eager_steps_ < warmup_steps_) {
    ++eager_steps_;
    return false;
  }
  if (!why_not.empty()) {
    say(fmt::format("train.cuda_graphs: eager steps while {}", why_not));
    return false;
  }
  return true;
}

void GraphStep::run(const at::Tensor& inputs, const at::Tensor& targets, const Body& body) {
#ifndef TRAINER_HAVE_CUDA
  body(inputs, targets);
#else
  auto& by_shape = graphs_->by_shape;
  const auto key = shape_key(inputs, targets);
  if (auto it = by_shape.find(key); it != by_shape.end()) {
    Graphs::Captured& c = *it->second;
    c.inputs.copy_(inputs, /*non_blocking=*/true);
    c.targets.copy_(targets, /*non_blocking=*/true);
    c.graph.replay();
    ++replays_;
    return;
  }
  if (static_cast<int>(by_shape.size()) >= kMaxShapes) {
    say(fmt::format("train.cuda_graphs: more than {} micro-batch shapes; shape {} runs eagerly",
                    kMaxShapes, inputs.sizes()));
    body(inputs, targets);
    return;
  }
  auto c = std::make_unique<Graphs::Captured>();
  c->inputs = inputs.clone();
  c->targets = targets.clone();
  if (const auto failure = capture(c->graph, c->inputs, c->targets, device_, body)) {
    disable(fmt::format("capturing micro-batch {} failed: {}", inputs.sizes(), *failure));
    body(inputs, targets);  // nothing ran during the capture: this micro-batch runs eagerly
    return;
  }
  ++captures_;
  // Capture only records: this micro-batch runs now, on the current stream.
  c->graph.replay();
  ++replays_;
  if (log_) {
    spdlog::info("train.cuda_graphs: captured forward + backward of micro-batch {} (replayed "
                 "from now on; {} shape(s) captured)",
                 inputs.sizes(), by_shape.size() + 1);
  }
  by_shape.emplace(key, std::move(c));
#endif
}

}  // namespace train
