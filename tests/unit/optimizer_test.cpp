// The optimizer step (train/optimizer.h): FusedAdamW makes the same updates as LibTorch's AdamW,
// neither it nor GradClipper allocates tensor memory in a step, and clipping follows
// torch.nn.utils.clip_grad_norm_.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>

#include "memory/allocator_guard.h"
#include "train/optimizer.h"

namespace TRAINER_UNITY_ID {

std::vector<at::Tensor> make_params(uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (auto shape :
       {std::vector<int64_t>{7, 5}, std::vector<int64_t>{5}, std::vector<int64_t>{64, 33}}) {
    params.push_back(at::randn(shape).set_requires_grad(true));
  }
  return params;
}

// The gradients of step s: deterministic, different every step.
void set_grads(std::vector<at::Tensor>& params, int s) {
  for (size_t i = 0; i < params.size(); ++i) {
    at::manual_seed(1000 * s + i);
    params[i].mutable_grad() = at::randn_like(params[i]) * (1.0 + s);
  }
}

TEST(OptimizerFusedAdamW, MatchesLibTorchAdamWStepByStep) {
  auto ours = make_params(3);
  auto reference = make_params(3);
  const train::AdamWHyper h{0.9, 0.95, 1e-8, 0.1};
  train::FusedAdamW fused(ours, h);
  torch::optim::AdamW adamw(reference, torch::optim::AdamWOptions(1e-2)
                                           .betas({h.beta1, h.beta2})
                                           .eps(h.eps)
                                           .weight_decay(h.weight_decay));
  for (int s = 0; s < 8; ++s) {
    const double lr = 1e-2 * (1.0 - 0.1 * s);  // a schedule: the rate changes every step
    set_grads(ours, s);
    set_grads(reference, s);
    fused.step(lr);
    for (auto& group : adamw.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    adamw.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      const double err = (ours[i] - reference[i]).abs().max().item<double>();
      EXPECT_LT(err, 1e-6) << "parameter " << i << " after step " << s + 1;
    }
  }
  EXPECT_EQ(fused.steps(), 8);
  // The moments too: a checkpoint of ours would resume like LibTorch's.
  const auto& state = static_cast<torch::optim::AdamWParamState&>(
      *adamw.state().at(reference[2].unsafeGetTensorImpl()));
  auto relative = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  EXPECT_LT(relative(fused.exp_avgs()[2], state.exp_avg()), 1e-6);
  EXPECT_LT(relative(fused.exp_avg_sqs()[2], state.exp_avg_sq()), 1e-6);
}

TEST(OptimizerFusedAdamW, StateIsAllocatedUpFrontAndAStepAllocatesNothing) {
  auto& guard = memory::CpuAllocatorGuard::instance();
  auto params = make_params(5);
  int64_t param_bytes = 0;
  for (const auto& p : params) param_bytes += p.nbytes();
  const int64_t before = guard.allocated_bytes();
  train::FusedAdamW fused(params, {});
  EXPECT_EQ(fused.state_bytes(), 2 * param_bytes);
  EXPECT_GE(guard.allocated_bytes() - before, fused.state_bytes());
  set_grads(params, 0);
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.grad().view({-1}));
  train::GradClipper clipper(flat);
  fused.step(1e-3);  // a first step outside the measurement: nothing lazy may hide in it
  const int64_t live = guard.allocated_bytes();
  guard.reset_peak();
  clipper.clip(0.5);
  fused.step(1e-3);
  // A few scalars at most (LibTorch wraps a scalar factor in a tensor); nothing parameter-sized.
  EXPECT_LE(guard.peak_bytes() - live, 256);
  EXPECT_EQ(guard.allocated_bytes(), live);
}

TEST(OptimizerGradClipper, NormAndScalingFollowClipGradNorm) {
  auto ours = make_params(7);
  auto reference = make_params(7);
  set_grads(ours, 2);
  set_grads(reference, 2);
  std::vector<at::Tensor> flat;
  for (const auto& p : ours) flat.push_back(p.grad().view({-1}));
  train::GradClipper clipper(flat);
  const double expected = torch::nn::utils::clip_grad_norm_(reference, 1.5);
  clipper.clip(1.5);
  const double norm = clipper.norm().item<double>();
  EXPECT_NEAR(norm, expected, 1e-4 * expected);
  double clipped = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LT((ours[i].grad() - reference[i].grad()).abs().max().item<double>(), 1e-6);
    clipped += ours[i].grad().pow(2).sum().item<double>();
  }
  EXPECT_NEAR(std::sqrt(clipped), 1.5, 1e-4);
}

TEST(OptimizerGradClipper, LeavesGradientsAloneWithinTheLimitOrWithoutOne) {
  auto params = make_params(9);
  set_grads(params, 1);
  std::vector<at::Tensor> flat, before;
  for (const auto& p : params) {
    flat.push_back(p.grad().view({-1}));
    before.push_back(p.grad().clone());
  }
  train::GradClipper clipper(flat);
  clipper.clip(0);  // 0: no clipping, the norm is still reported
  const double norm = clipper.norm().item<double>();
  EXPECT_GT(norm, 1);
  clipper.clip(norm * 2);  // within the limit: multiplied by exactly 1
  EXPECT_DOUBLE_EQ(clipper.norm().item<double>(), norm);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].grad().equal(before[i])) << i;
}

}  // namespace TRAINER_UNITY_ID
