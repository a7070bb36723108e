#include "models/layers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace models {
namespace {

// Note [Fused GELU on the CPU]
// at::gelu's forward evaluates tanh (or erf) per element and its backward evaluates it again,
// with exp for erf: on a GPT block's [positions, 4 d] activation these passes cost as much as a
// tenth of a CPU step. Here forward writes the output and the derivative in one pass and
// backward multiplies. The loops are plain float arithmetic (exp by range reduction and a
// polynomial, no library calls) so that the compiler vectorizes them; target_clones builds an
// AVX2+FMA version next to the baseline one and picks at load time by the CPU it runs on. The
// file is compiled with -fno-trapping-math (src/models/CMakeLists.txt), without which GCC keeps
// the clamp below as a branch and vectorizes nothing; nothing here reads floating-point flags.

// e^x for x <= 0 (both uses below), to about 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, e^r by its
// degree-6 polynomial (Cephes' expf), 2^n through the exponent bits.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // e^-87 is still a normal float; below it the result is ~0 anyway
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer...
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // ...held in the low mantissa bits, read as an integer without a float-to-int conversion.
  const uint32_t n_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRound);
  return er * std::bit_cast<float>((n_bits + 127u) << 23);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// y = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); tanh(u) = sign(u) (1 - e) / (1 + e)
// with e = exp(-2 |u|) <= 1 (no overflow; near 0 its absolute error is ~1e-7, which is what y
// and y' need).
inline void gelu_tanh_point(float x, float* y, float* dy) {
  const float x2 = x * x;
  const float u = kSqrt2OverPi * (x + kCubic * x2 * x);
  const float e = exp_nonpositive(-2.0f * std::fabs(u));
  const float t = std::copysign((1.0f - e) / (1.0f + e), u);
  *y = 0.5f * x * (1.0f + t);
  if (dy != nullptr) {
    *dy =
        0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
  }
}

// y = x Phi(x), y' = Phi(x) + x phi(x), with erf by Abramowitz & Stegun 7.1.26 (absolute error
// below 1.5e-7), whose e^{-z^2} is phi's exponential too.
inline void gelu_erf_point(float x, float* y, float* dy) {
  const float z = std::fabs(x) * kInvSqrt2;
  const float g = exp_nonpositive(-z * z);  // e^{-x^2 / 2}
  const float k = 1.0f / (1.0f + 0.3275911f * z);
  const float poly =
      k * (0.254829592f +
           k * (-0.284496736f + k * (1.421413741f + k * (-1.453152027f + k * 1.061405429f))));
  const float erf_abs = 1.0f - poly * g;
  const float phi_cdf = 0.5f * (1.0f + std::copysign(erf_abs, x));
  *y = x * phi_cdf;
  if (dy != nullptr) *dy = phi_cdf + x * kInvSqrt2Pi * g;
}

// The loop is compiled twice, for AVX2/FMA and the baseline, and the loader picks one. Two builds
// get the baseline's alone: clang (14, the fuzz builds) multiversions no function template, and
// target_clones makes an ifunc, whose resolver runs while the dynamic loader relocates the binary,
// before a sanitizer's runtime has started: instrumented (scripts/sanitize.sh), it crashed the
// ThreadSanitizer build's binaries before main.
#if defined(__clang__) || defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TRAINER_CPU_CLONES
#else
#define TRAINER_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif

template <bool kTanh, bool kSlope>
TRAINER_CPU_CLONES void gelu_loop(const float* __restrict x, float* __restrict y,
                                  float* __restrict dy, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float a, b;
    if constexpr (kTanh) {
      gelu_tanh_point(x[i], &a, kSlope ? &b : nullptr);
    } else {
      gelu_erf_point(x[i], &a, kSlope ? &b : nullptr);
    }
    y[i] = a;
    if constexpr (kSlope) dy[i] = b;
  }
}
#undef TRAINER_CPU_CLONES  // the rest of a unity batch never sees it

// Writes y (and dy when defined) for every element of the contiguous float tensor x.
void gelu_kernel(const at::Tensor& x, at::Tensor& y, at::Tensor* dy, GeluApprox approx) {
  // An operator in profiler traces (train/profiler.h), as at::gelu is.
  RECORD_FUNCTION("models::fused_gelu", std::vector<c10::IValue>());
  const float* in = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  float* slope = dy != nullptr ? dy->data_ptr<float>() : nullptr;
  constexpr int64_t kGrain = 32768;
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    float* s = slope != nullptr ? slope + begin : nullptr;
    if (approx == GeluApprox::kTanh) {
      s != nullptr ? gelu_loop<true, true>(in + begin, out + begin, s, n)
                   : gelu_loop<true, false>(in + begin, out + begin, nullptr, n);
    } else {
      s != nullptr ? gelu_loop<false, true>(in + begin, out + begin, s, n)
                   : gelu_loop<false, false>(in + begin, out + begin, nullptr, n);
    }
  });
}

struct FusedGelu final : torch::autograd::Function<FusedGelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t approx) {
    at::Tensor y = at::empty_like(x);
    at::Tensor dy = at::empty_like(x);
    gelu_kernel(x, y, &dy, static_cast<GeluApprox>(approx));
    ctx->save_for_backward({dy});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads.at(0) * ctx->get_saved_variables().at(0), at::Tensor()};
  }
};

}  // namespace

at::Tensor gelu(const at::Tensor& x, GeluApprox approx) {
  const bool fused = x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous();
  if (!fused) return at::gelu(x, approx == GeluApprox::kTanh ? "tanh" : "none");
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    return FusedGelu::apply(x, static_cast<int64_t>(approx));
  }
  at::Tensor y = at::empty_like(x);
  gelu_kernel(x, y, nullptr, approx);
  return y;
}

}  // namespace models
