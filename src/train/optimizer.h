// The optimizer step of one rank: gradient clipping over the flat gradient buckets, then AdamW.
//
// Contract (docs/DESIGN.md, "The OOM protocol", points 1 and 8): everything the step needs is
// allocated at construction, before step 1, and the step itself allocates no tensor memory beyond a
// few scalars. An out-of-memory error can therefore only come from forward or backward, which the
// protocol recovers from; the optimizer step, which runs after the status vote and changes the
// parameters, never has to be undone on one rank.
//
// FusedAdamW runs ATen's fused AdamW kernel (the one behind torch.optim.AdamW(fused=True), on CPU
// and CUDA): one pass over each parameter, no temporaries, the same update as torch::optim::AdamW
// (decoupled weight decay, bias-corrected moments). Every parameter must have a gradient of its
// own shape, dtype and device when step() runs (the Reducer's bucket views).
//
// GradClipper computes the global L2 norm of the flat gradient buffers into preallocated
// per-buffer slots and multiplies them by min(1, max_norm / (norm + 1e-6)), as
// torch.nn.utils.clip_grad_norm_ does, on the device: the norm is never read on the host here.
//
// Sharded (ddp.shard, ddp/reducer.h): FusedAdamW runs over each rank's blocks of the flat
// parameter buffers with the reduced gradient blocks given explicitly, so its moments (and
// state_bytes()) are this rank's share; GradClipper sums the squared norms of the ranks' blocks
// with an all-reduce on the data communicator (device tensors: no host read either).
//
// Neither is thread-safe; both are used by the training thread only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "ddp/communicator.h"

namespace train {

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// Element ranges [begin, end) of a tensor, in its flat element order.
using ElementRanges = std::vector<std::pair<int64_t, int64_t>>;

class FusedAdamW {
 public:
  // Allocates both moments of every parameter and the step counter now. `grads`, when given
  // (one per parameter, same shape), are the gradients step() uses instead of each .grad (sharded
  // blocks: views with no .grad of their own). `updates`, when given (one per parameter), are the
  // ranges of each that AdamW updates; the rest belongs to another optimizer, which keeps its
  // state in the moments' same elements (Muon's momentum in exp_avgs: train/muon.h). A range
  // short of the whole parameter needs a 1-D parameter (a bucket's block). Empty: all of every
  // parameter.
  FusedAdamW(std::vector<at::Tensor> params, AdamWHyper hyper, std::vector<at::Tensor> grads = {},
             std::vector<ElementRanges> updates = {});

  // One update at learning rate `lr` from the parameters' current gradients. With `found_inf`
  // (fp16 loss scaling: a float [1] tensor on the parameters' device, 1 when the reduced gradients
  // hold an inf or NaN) the kernel itself skips the update where it is set, and the step counter
  // does not advance: the decision never leaves the device.
  void step(double lr, const at::Tensor* found_inf = nullptr);

  // Steps taken (with found_inf: steps attempted; skipped ones are not counted on the device).
  int64_t steps() const { return steps_; }
  // Resuming: the steps already taken (bias correction continues from there).
  void set_steps(int64_t steps);
  // Bytes of optimizer state: two moments per parameter, in the parameter's dtype (the elements
  // another optimizer updates included: it keeps its state there).
  int64_t state_bytes() const;
  const std::vector<at::Tensor>& exp_avgs() const { return exp_avgs_; }
  const std::vector<at::Tensor>& exp_avg_sqs() const { return exp_avg_sqs_; }
  // The step counter the kernel reads (float32 0-dim, on the device; behind steps() by the steps
  // fp16 skipped).
  const at::Tensor& step_count() const { return count_; }

 private:
  // The pieces the kernel updates, each a whole parameter or a range of one (views).
  struct Piece {
    size_t param;
    int64_t begin, end;
    bool whole;
  };
  // The gradients of the pieces: the explicit ones, or each parameter's .grad now.
  std::vector<at::Tensor> piece_grads() const;
  static at::Tensor cut(const at::Tensor& t, const Piece& piece);

  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;  // explicit gradients (empty: each parameter's .grad)
  std::vector<at::Tensor> exp_avgs_;
  std::vector<at::Tensor> exp_avg_sqs_;
  std::vector<Piece> pieces_;
  std::vector<at::Tensor> piece_params_, piece_exp_avgs_, piece_exp_avg_sqs_;
  std::vector<at::Tensor> step_counts_;  // the same float32 counter per piece, as the kernel wants
  at::Tensor count_;                     // that counter
  AdamWHyper hyper_;
  int64_t steps_ = 0;
};

class GradClipper {
 public:
  // `flat_grads`: every gradient exactly once (the Reducer's bucket buffers); one device. With
  // `sum_over` (sharded), each rank holds a disjoint part of the gradients and the squared norms
  // are summed across its ranks (a collective in every clip()).
  // `rider_slots` float values ride in that all-reduce (rider()). `replicas`: how many ranks of
  // `sum_over` hold each block (hybrid sharding summed over the world); the summed squares are
  // divided by it.
  explicit GradClipper(std::vector<at::Tensor> flat_grads, ddp::Communicator* sum_over = nullptr,
                       int64_t rider_slots = 0, int replicas = 1);

  // Computes the global L2 norm before clipping into norm() and scales the gradients so the norm
  // is at most `max_norm` (max_norm <= 0: no clipping). Queues device work only: no host read.
  void clip(double max_norm);
  // The norm of the last clip() (float32, 0-dim, on the gradients' device).
  const at::Tensor& norm() const { return total_; }
  // With `sum_over`: float32 values summed over its ranks in clip()'s all-reduce of the squared
  // norms, with no collective of their own (the spike guard's global loss, train/spike_guard.h):
  // the caller writes this rank's values before clip() and reads the sums after. Undefined
  // without `sum_over` or slots.
  const at::Tensor& rider() const { return rider_; }

 private:
  std::vector<at::Tensor> grads_;
  ddp::Communicator* sum_over_ = nullptr;
  int replicas_ = 1;
  at::Tensor norms_;    // one float32 slot per buffer
  at::Tensor reduced_;  // float32 [1 + rider slots]: what the all-reduce carries
  at::Tensor total_;    // float32 scalar: reduced_[0]
  at::Tensor rider_;    // reduced_[1:]
  at::Tensor coef_;     // float32 scalar: the clip coefficient
};

}  // namespace train
