// models/layers.h: linear() is nn::Linear's function; the fused CPU GELU agrees with at::gelu in
// value and slope (both measured against double precision), for both approximations, over the
// whole float range that matters.
#include "models/layers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>

namespace TRAINER_UNITY_ID {

// Values around every regime: the tails (where tanh and erf saturate and e^-z underflows), the
// region near 0 (where tanh's 1 - e cancels) and a dense normal sample.
at::Tensor probe_points() {
  at::manual_seed(7);
  const float edges[] = {-1e4f, -100.0f, -20.0f, -9.0f, -5.5f, -3.0f, -1.0f, -1e-3f, -1e-7f, 0.0f,
                         1e-7f, 1e-3f,   0.5f,   1.0f,  3.0f,  5.5f,  9.0f,  20.0f,  100.0f, 1e4f};
  return at::cat({at::tensor(at::ArrayRef<float>(edges)), at::linspace(-12, 12, 24001),
                  at::randn({100000}) * 3});
}

// The largest error of gelu's float value and slope against at::gelu in double precision,
// relative to max(|reference|, 1) (|gelu(x)| ~ |x| in the right tail).
struct Errors {
  float value, slope;
};
Errors errors(const at::Tensor& x, const char* name,
              const std::function<at::Tensor(const at::Tensor&)>& gelu) {
  const at::Tensor in = x.clone().requires_grad_(true);
  const at::Tensor y = gelu(in);
  const at::Tensor exact_in = x.to(at::kDouble).requires_grad_(true);
  const at::Tensor exact = at::gelu(exact_in, name);
  const at::Tensor ones = at::ones_like(x);
  torch::autograd::backward({y}, {ones});
  torch::autograd::backward({exact}, {ones.to(at::kDouble)});
  const auto err = [](const at::Tensor& a, const at::Tensor& ref) {
    return ((a.to(at::kDouble) - ref).abs() / at::clamp_min(ref.abs(), 1.0)).max().item<float>();
  };
  return {err(y.detach(), exact.detach()), err(in.grad(), exact_in.grad())};
}

void expect_as_accurate_as_aten(models::GeluApprox approx, const char* name) {
  const at::Tensor x = probe_points();
  // The fused path ran (the fallback would match trivially).
  const at::Tensor y = models::gelu(x.clone().requires_grad_(true), approx);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_NE(y.grad_fn()->name().find("FusedGelu"), std::string::npos) << y.grad_fn()->name();
  const Errors ours =
      errors(x, name, [&](const at::Tensor& in) { return models::gelu(in, approx); });
  const Errors aten = errors(x, name, [&](const at::Tensor& in) { return at::gelu(in, name); });
  std::printf("gelu(%s) against double: value %.2e (at::gelu float %.2e), slope %.2e (%.2e)\n",
              name, ours.value, aten.value, ours.slope, aten.slope);
  // As accurate as ATen's own float gelu (whose tanh slope is itself 1.04e-6 off near x = -5).
  EXPECT_LE(ours.value, std::max(5e-7f, 1.1f * aten.value));
  EXPECT_LE(ours.slope, std::max(5e-7f, 1.1f * aten.slope));
  // Without a gradient (evaluation), the same values.
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(models::gelu(x, approx), y.detach()));
}

TEST(LayersFusedGelu, TanhApproximationIsAsAccurateAsAtenInValueAndSlope) {
  expect_as_accurate_as_aten(models::GeluApprox::kTanh, "tanh");
}

TEST(LayersFusedGelu, ExactGeluIsAsAccurateAsAtenInValueAndSlope) {
  expect_as_accurate_as_aten(models::GeluApprox::kNone, "none");
}

TEST(LayersFusedGelu, NanPropagatesAndOtherTensorsFallBackToAten) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor x = at::tensor({nan, 1.0f}).requires_grad_(true);
  const at::Tensor y = models::gelu(x, models::GeluApprox::kTanh);
  EXPECT_TRUE(std::isnan(y[0].item<float>()));
  // double, and a non-contiguous view: at::gelu's own result.
  const at::Tensor d = at::randn({64}, at::kDouble);
  EXPECT_TRUE(at::equal(models::gelu(d, models::GeluApprox::kNone), at::gelu(d)));
  const at::Tensor strided = at::randn({8, 8}).t();
  EXPECT_TRUE(
      at::equal(models::gelu(strided, models::GeluApprox::kTanh), at::gelu(strided, "tanh")));
}

TEST(LayersLinear, MatchesTheModuleForTwoAndThreeDimensionalInputs) {
  torch::nn::Linear layer(16, 24);
  for (const auto& x : {at::randn({5, 16}), at::randn({3, 7, 16})}) {
    const at::Tensor ours = models::linear(layer, x);
    EXPECT_TRUE(at::allclose(ours, layer->forward(x), 1e-5, 1e-6)) << x.sizes();
    EXPECT_EQ(ours.sizes(), layer->forward(x).sizes());
  }
}

}  // namespace TRAINER_UNITY_ID
