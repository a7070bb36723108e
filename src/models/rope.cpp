#include "models/rope.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

namespace models {

void check_rope_options(const RopeOptions& o, const std::string& prefix) {
  const auto bad = [&](const char* key, const std::string& why) {
    return std::invalid_argument(fmt::format("{}{}: {}", prefix, key, why));
  };
  if (!(o.theta > 1.0)) throw bad("rope_theta", fmt::format("must be above 1, got {}", o.theta));
  if (o.scaling == "none") return;
  if (o.scaling != "llama3") {
    throw bad("rope_scaling", fmt::format("unknown rope scaling '{}'; known: none, llama3", o.scaling));
  }
  if (!(o.factor >= 1.0)) throw bad("rope_factor", fmt::format("must be at least 1, got {}", o.factor));
  if (!(o.low_freq_factor > 0.0)) {
    throw bad("rope_low_freq_factor", fmt::format("must be positive, got {}", o.low_freq_factor));
  }
  if (!(o.high_freq_factor > o.low_freq_factor)) {
    throw bad("rope_high_freq_factor",
              fmt::format("({}) must be above rope_low_freq_factor ({})", o.high_freq_factor,
                          o.low_freq_factor));
  }
  if (o.original_context <= 0) {
    throw bad("rope_original_context", fmt::format("must be positive, got {}", o.original_context));
  }
}

at::Tensor rope_frequencies(int64_t head_dim, const RopeOptions& o) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw std::invalid_argument(fmt::format("rope: the head size ({}) must be even", head_dim));
  }
  check_rope_options(o);
  // As transformers: theta ** (arange(0, d, 2) / d) in float32, then its reciprocal.
  const at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) /
                              static_cast<float>(head_dim);
  at::Tensor f = 1.0 / at::pow(static_cast<float>(o.theta), exponent);
  if (o.scaling != "llama3") return f;
  const double old = static_cast<double>(o.original_context);
  const double low_wavelen = old / o.low_freq_factor, high_wavelen = old / o.high_freq_factor;
  const at::Tensor wavelen = 2.0 * std::numbers::pi / f;
  const at::Tensor slowed = f / o.factor;
  const at::Tensor smooth = (old / wavelen - o.low_freq_factor) /
                            (o.high_freq_factor - o.low_freq_factor);
  const at::Tensor blended = (1.0 - smooth) * slowed + smooth * f;
  return at::where(wavelen < high_wavelen, f, at::where(wavelen > low_wavelen, slowed, blended));
}

RopeTables rope_tables(const at::Tensor& frequencies, int64_t start, int64_t length,
                       c10::Device device) {
  const at::Tensor f = frequencies.to(device, at::kFloat);
  const at::Tensor t = at::arange(start, start + length, f.options().dtype(at::kLong)).to(at::kFloat);
  const at::Tensor half = at::outer(t, f);  // [T, head_dim / 2]
  const at::Tensor angles = at::cat({half, half}, -1);
  return {angles.cos(), angles.sin()};
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor cos = tables.cos.to(x.scalar_type()), sin = tables.sin.to(x.scalar_type());
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace models
