#include "models/rope.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <stdexcept>

#include "models/block.h"

namespace models {

void check_rope_options(const RopeOptions& o, const std::string& prefix) {
  const auto bad = [&](const char* key, const std::string& why) {
    return std::invalid_argument(fmt::format("{}{}: {}", prefix, key, why));
  };
  if (!(o.theta > 1.0)) throw bad("rope_theta", fmt::format("must be above 1, got {}", o.theta));
  if (o.scaling == "none") return;
  if (o.scaling != "llama3" && o.scaling != "linear") {
    throw bad("rope_scaling",
              fmt::format("unknown rope scaling '{}'; known: none, llama3, linear", o.scaling));
  }
  if (!(o.factor >= 1.0))
    throw bad("rope_factor", fmt::format("must be at least 1, got {}", o.factor));
  if (o.scaling == "linear") return;
  if (!(o.low_freq_factor > 0.0)) {
    throw bad("rope_low_freq_factor", fmt::format("must be positive, got {}", o.low_freq_factor));
  }
  if (!(o.high_freq_factor > o.low_freq_factor)) {
    throw bad("rope_high_freq_factor", fmt::format("({}) must be above rope_low_freq_factor ({})",
                                                   o.high_freq_factor, o.low_freq_factor));
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
  const at::Tensor f = rotary_inv_freq(head_dim, o.theta);
  if (o.scaling == "linear") return f / o.factor;
  if (o.scaling != "llama3") return f;
  const double old = static_cast<double>(o.original_context);
  const double low_wavelen = old / o.low_freq_factor, high_wavelen = old / o.high_freq_factor;
  const at::Tensor wavelen = 2.0 * std::numbers::pi / f;
  const at::Tensor slowed = f / o.factor;
  const at::Tensor smooth =
      (old / wavelen - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
  const at::Tensor blended = (1.0 - smooth) * slowed + smooth * f;
  return at::where(wavelen < high_wavelen, f, at::where(wavelen > low_wavelen, slowed, blended));
}

}  // namespace models
