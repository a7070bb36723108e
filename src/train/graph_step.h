// GraphStep: CUDA graph capture of one micro-batch's forward + backward (train.cuda_graphs).
//
// After `warmup_steps` eager steps (lazy initialisation, cuDNN autotuning, the allocator's
// steady state), the first micro-batch of each input shape is captured with at::cuda::CUDAGraph
// on a side stream (capture only records; the graph is then replayed once for that micro-batch)
// and every later micro-batch of that shape is copied into the graph's static input buffers and
// replayed: one launch instead of hundreds. What the graph reads and writes must stay where it
// was at capture: the parameters, the Reducer's gradient buckets (backward accumulates into
// them), the loss scale and the Trainer's loss accumulator; all are allocated once, before step 1.
//
// The gradient all-reduce stays outside the graph: the Trainer runs captured micro-batches with
// the Reducer accumulating only and reduces every bucket after the last replay (so at world
// size > 1 communication no longer overlaps backward; at world size 1 nothing is communicated).
// The optimizer (a few multi-tensor kernels) runs eagerly between replays.
//
// Eager instead, with the reason logged once by rank 0 (`why_not` from the Trainer, or found
// here): no CUDA device; activation checkpointing on (it saves and restores the RNG state on
// the host); a test injection in this step; more input shapes than kMaxShapes; a capture that
// failed (an operation that cannot be captured: the graph is dropped, the micro-batch reruns
// eagerly, and graphs stay off for the run). A fallback of the OOM ladder calls invalidate():
// the graphs are dropped and the next step captures anew at the new micro-batch size. An
// out-of-memory error during capture drops the graph and propagates as the step's OOM.
//
// Dropout in a graph draws from the default CUDA generator, registered with each graph, so the
// per-step seeding (train/step_rng.h) holds for replays too.
//
// One thread (the training thread); not copyable.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace train {

class GraphStep {
 public:
  // What one micro-batch does: forward, loss, backward, loss accumulation, all on the device.
  using Body = std::function<void(const at::Tensor& inputs, const at::Tensor& targets)>;
  static constexpr int kMaxShapes = 4;

  // `requested`: train.cuda_graphs. `log`: whether this rank logs (rank 0).
  GraphStep(bool requested, c10::Device device, int64_t warmup_steps, bool log);
  ~GraphStep();
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  // Whether the micro-batches of this step go through run(): requested, on CUDA, past warm-up,
  // not disabled, and `why_not` empty (else it is logged once and the step runs eagerly).
  // Call once per step attempt.
  bool use_for_step(const std::string& why_not);
  // Replays the graph captured for the micro-batch's shape, capturing it first if there is none.
  void run(const at::Tensor& inputs, const at::Tensor& targets, const Body& body);
  // Drops every graph: the next step (past warm-up) captures anew.
  void invalidate(const std::string& why);

  int captures() const { return captures_; }
  int replays() const { return replays_; }
  bool disabled() const { return !disabled_reason_.empty(); }

 private:
  struct Graphs;  // the captured graphs and their static buffers (CUDA builds)

  void say(const std::string& message);
  void disable(const std::string& why);

  bool requested_;
  c10::Device device_;
  int64_t warmup_steps_;
  bool log_;
  int64_t eager_steps_ = 0;
  int captures_ = 0;
  int replays_ = 0;
  std::string disabled_reason_;
  std::string last_said_;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace train
