// The frequencies of Llama's rotary position embeddings (RoPE), with Llama 3.1's scaling.
//
// Frequencies: head_dim / 2 of them, f_i = theta^(-2i / head_dim). With the `llama3` scaling
// (the rope_scaling / rope_parameters of Llama 3.1 and 3.2 configs), each wavelength
// w_i = 2 pi / f_i is compared with the original context L (original_max_position_embeddings):
// w_i < L / high_freq_factor keeps f_i, w_i > L / low_freq_factor takes f_i / factor, and the band
// between blends the two, s f_i + (1 - s) f_i / factor with s = (L / w_i - low_freq_factor) /
// (high_freq_factor - low_freq_factor) (Meta's apply_scaling).
//
// The rotation itself is the block's (models/block.h, Rotary: the first half of a head pairs with
// its second half, the Hugging Face layout); this file gives it the frequencies. They are float32
// and computed as transformers computes them, so that logits match its own to rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace models {

struct RopeOptions {
  double theta = 10000.0;
  std::string scaling = "none";     // "none", "llama3" or "linear"
  double factor = 8.0;              // llama3: how much the long wavelengths are slowed; linear: all
  double low_freq_factor = 1.0;     // llama3: wavelengths above L / low_freq_factor are scaled
  double high_freq_factor = 4.0;    // llama3: wavelengths below L / high_freq_factor are kept
  int64_t original_context = 8192;  // llama3: L, the context the model was first trained at
};

// Throws std::invalid_argument naming `prefix`'s key (model.rope_theta, model.rope_scaling, ...)
// for a value the formulas above cannot take: theta <= 1, an unknown scaling, factor < 1,
// high_freq_factor <= low_freq_factor, low_freq_factor <= 0 or original_context <= 0.
void check_rope_options(const RopeOptions& options, const std::string& prefix = "model.");

// f_i, float32 [head_dim / 2] on the CPU (head_dim even).
at::Tensor rope_frequencies(int64_t head_dim, const RopeOptions& options);

}  // namespace models
