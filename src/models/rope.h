// Rotary position embeddings (RoPE), as Llama uses them, with Llama 3.1's frequency scaling.
//
// Frequencies: head_dim / 2 of them, f_i = theta^(-2i / head_dim). With the `llama3` scaling
// (the rope_scaling / rope_parameters of Llama 3.1 and 3.2 configs), each wavelength
// w_i = 2 pi / f_i is compared with the original context L (original_max_position_embeddings):
// w_i < L / high_freq_factor keeps f_i, w_i > L / low_freq_factor takes f_i / factor, and the band
// between blends the two, s f_i + (1 - s) f_i / factor with s = (L / w_i - low_freq_factor) /
// (high_freq_factor - low_freq_factor) (Meta's apply_scaling).
//
// Rotation: position t turns the pair (x_i, x_{i + head_dim / 2}) of every head by the angle
// t f_i: the first half of a head pairs with its second half (the Hugging Face layout of the
// q_proj / k_proj weights, not the interleaved pairs of Meta's original checkpoints).
//
// Contract: the tables are float32, computed as transformers computes them (angles t * f_i in
// float32, then cos and sin), so that logits match its own to rounding; apply_rope computes in
// the dtype of x (the tables are cast to it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace models {

struct RopeOptions {
  double theta = 10000.0;
  std::string scaling = "none";   // "none" or "llama3"
  double factor = 8.0;             // llama3: how much the long wavelengths are slowed
  double low_freq_factor = 1.0;    // llama3: wavelengths above L / low_freq_factor are scaled
  double high_freq_factor = 4.0;   // llama3: wavelengths below L / high_freq_factor are kept
  int64_t original_context = 8192; // llama3: L, the context the model was first trained at
};

// Throws std::invalid_argument naming `prefix`'s key (model.rope_theta, model.rope_scaling, ...)
// for a value the formulas above cannot take: theta <= 1, an unknown scaling, factor < 1,
// high_freq_factor <= low_freq_factor, low_freq_factor <= 0 or original_context <= 0.
void check_rope_options(const RopeOptions& options, const std::string& prefix = "model.");

// f_i, float32 [head_dim / 2] on the CPU (head_dim even).
at::Tensor rope_frequencies(int64_t head_dim, const RopeOptions& options);

// cos and sin of the angles of positions start .. start + length - 1: each [length, head_dim]
// (frequency i at columns i and i + head_dim / 2), float32, on `device`.
struct RopeTables {
  at::Tensor cos, sin;
};
RopeTables rope_tables(const at::Tensor& frequencies, int64_t start, int64_t length,
                       c10::Device device);

// x [..., T, head_dim] rotated by the tables of its T positions ([T, head_dim]).
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables);

}  // namespace models
