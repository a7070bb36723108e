// TextEncoder: a frozen GPT-2-style byte-level transformer that turns an item's text into one
// vector (the recommender's item metadata embedding).
//
// Input: int64 [n, L] tokens, L <= max_len: the UTF-8 bytes of each text (0..255), padded with
// kPadId (256) after the text. Output: float [n, out_dim] = the mean of the final hidden states
// over the non-padding positions, times a projection. An all-padding row gives the projection's
// bias. Rows are encoded independently, so a text's vector does not depend on what else is in
// the batch (the recommender's cached and uncached modes rely on it).
//
// Architecture (GPT-2): token + learned position embeddings; `layers` pre-LayerNorm blocks
// (models/block.h: frozen, Conv1D layout, at::gelu) of causal multi-head self-attention and a 4x
// GELU (tanh) MLP, each with a residual; a final LayerNorm. Padding keys are masked out as
// well, so padding anywhere gives the same result as padding at the end.
//
// Frozen: every weight is registered as a *buffer*, not a parameter. `.to(device)` moves them,
// `save()` writes them and `named_buffers()` lists them, but `parameters()` of this module (and
// of any module holding it) does not, so no optimizer, gradient reducer or gradient clipping ever
// sees them, and no autograd graph is built through them. Buffers were chosen over parameters
// with requires_grad=false because LibTorch's `parameters()` has no way to skip frozen ones.
//
// Weights: seeded random initialisation (GPT-2's: N(0, 0.02), residual projections scaled by
// 1/sqrt(2 layers); the output projection N(0, 1/dim) so the frozen features have unit scale),
// drawn on the CPU from `seed`, so every rank and machine builds the same encoder. Or
// `load_safetensors`, by name. The names are GPT-2's (Hugging Face layout, without the
// "transformer." prefix) and linear weights are stored [in, out] as GPT-2's Conv1D does:
//   wte.weight [257, dim]  wpe.weight [max_len, dim]
//   h.<i>.ln_1.{weight,bias} [dim]   h.<i>.attn.c_attn.weight [dim, 3 dim]  .bias [3 dim]
//   h.<i>.attn.c_proj.weight [dim, dim]  .bias [dim]   h.<i>.ln_2.{weight,bias} [dim]
//   h.<i>.mlp.c_fc.weight [dim, 4 dim]  .bias [4 dim]   h.<i>.mlp.c_proj.weight [4 dim, dim]  .bias
//   ln_f.{weight,bias} [dim]   proj.weight [dim, out_dim]  proj.bias [out_dim]
//
// Not thread-safe (a torch::nn::Module).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace models {

class Block;

struct TextEncoderOptions {
  int64_t dim = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t max_len = 64;
  int64_t out_dim = 64;
  uint64_t seed = 0;
};

class TextEncoder final : public torch::nn::Module {
 public:
  // Byte values 0..255 are tokens; the padding id follows them. data::kTextPadId must match.
  static constexpr int64_t kPadId = 256;
  static constexpr int64_t kVocab = 257;

  // Throws std::invalid_argument for a size that is not positive or heads not dividing dim.
  explicit TextEncoder(const TextEncoderOptions& options);

  // tokens: int64 [n, L] on the encoder's device, L <= max_len. Returns [n, out_dim].
  at::Tensor forward(const at::Tensor& tokens) const;

  // Replaces every weight with the tensor of the same name in the safetensors file at `path`
  // (any floating dtype; converted). All-or-nothing: on a SafetensorsError naming the file and
  // tensor (missing name, wrong shape, non-floating dtype, a tensor the encoder does not have)
  // the weights are unchanged.
  void load_safetensors(const std::string& path);

  // Name -> weight, in the names load_safetensors expects (what a test writes to make a file).
  std::map<std::string, at::Tensor> weights() const;

  const TextEncoderOptions& options() const { return options_; }

 private:
  // Registers `value` as a buffer under the dotted `name`, creating the submodules on the way, so
  // named_buffers() reports the GPT-2 names. Returns a handle sharing the buffer's storage.
  at::Tensor add(const std::string& name, at::Tensor value);

  TextEncoderOptions options_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> holders_;
  at::Tensor wte_, wpe_, ln_f_w_, ln_f_b_, proj_w_, proj_b_;
  std::vector<std::shared_ptr<Block>> blocks_;  // registered as h.{i}
};

}  // namespace models
