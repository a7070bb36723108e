// The optimizer step of one rank: gradient clipping over the flat gradient buckets, then AdamW.
//
// Contract (DESIGN.md, OOM protocol, point 1): everything the step needs is allocated at
// construction, before step 1, and the step itself allocates no tensor memory beyond a few
// scalars. An out-of-memory error can therefore only come from forward or backward, which the
// protocol recovers from; the optimizer step, which runs after the status vote and changes the
// parameters, never has to be undone on one rank.
//
// FusedAdamW runs ATen's fused AdamW kernel (the one behind torch.optim.AdamW(fused=True), on CPU
// and CUDA): one pass over each parameter, no temporaries, the same update as torch::optim::AdamW
// (decoupled weight decay, bias-corrected moments). Every parameter must have a gradient of its
// own shape, dtype and device when step() runs (the Reducer's bucket views).
//
// GradClipper computes the global L2 norm of the flat gradient buffers into preallocated
// per-buffer slots and scales them only when the norm exceeds the limit.
//
// Neither is thread-safe; both are used by the training thread only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace train {

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class FusedAdamW {
 public:
  // Allocates both moments of every parameter and the step counter now.
  FusedAdamW(std::vector<at::Tensor> params, AdamWHyper hyper);

  // One update at learning rate `lr` from the parameters' current gradients.
  void step(double lr);

  int64_t steps() const { return steps_; }
  // Resuming: the steps already taken (bias correction continues from there).
  void set_steps(int64_t steps) { steps_ = steps; }
  // Bytes of optimizer state: two moments per parameter, in the parameter's dtype.
  int64_t state_bytes() const;
  const std::vector<at::Tensor>& exp_avgs() const { return exp_avgs_; }
  const std::vector<at::Tensor>& exp_avg_sqs() const { return exp_avg_sqs_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> exp_avgs_;
  std::vector<at::Tensor> exp_avg_sqs_;
  std::vector<at::Tensor> step_counts_;  // the same float32 counter per parameter, as the kernel wants
  AdamWHyper hyper_;
  int64_t steps_ = 0;
};

class GradClipper {
 public:
  // `flat_grads`: every gradient exactly once (the Reducer's bucket buffers); one device.
  explicit GradClipper(std::vector<at::Tensor> flat_grads);

  // Returns the global L2 norm before clipping; scales the gradients so the norm is at most
  // `max_norm` (no scaling when max_norm <= 0 or the norm is within it). Synchronises with the
  // device once (the norm is read on the host).
  double clip(double max_norm);

 private:
  std::vector<at::Tensor> grads_;
  at::Tensor norms_;  // one float32 slot per buffer
  at::Tensor total_;  // float32 scalar
};

}  // namespace train
