#include "models/lm/lm_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace models {
namespace {

// One block's parameters, in Block's registration order (models/block.h): norm_1, the attention
// (qkv, out), norm_2, the MLP (gate, up, out); each projection's weight before its bias.
void block_parameters(const LmShape& s, int64_t i, std::vector<LmShape::Parameter>& out) {
  const int64_t d = s.d_model, a = s.heads * s.head_dim, k = s.kv_heads * s.head_dim;
  const bool gpt = !s.swiglu;
  const std::string p = fmt::format("{}.{}.", gpt ? "h" : "layers", i);
  const size_t unit = static_cast<size_t>(1 + i);
  const auto add = [&](const std::string& name, int64_t numel) {
    out.push_back({p + name, numel, unit});
  };
  const auto projection = [&](const std::string& name, int64_t in, int64_t n_out, bool bias) {
    add(name + ".weight", in * n_out);
    if (bias) add(name + ".bias", n_out);
  };
  const auto norm = [&](const std::string& name) {
    add(name + ".weight", d);
    if (gpt) add(name + ".bias", d);
  };
  norm(gpt ? "ln_1" : "input_layernorm");
  projection(gpt ? "attn.c_attn" : "self_attn.qkv_proj", d, a + 2 * k, s.attention_bias);
  projection(gpt ? "attn.c_proj" : "self_attn.o_proj", a, d, s.attention_bias);
  norm(gpt ? "ln_2" : "post_attention_layernorm");
  if (s.swiglu) projection("mlp.gate_proj", d, s.intermediate, s.mlp_bias);
  projection(gpt ? "mlp.c_fc" : "mlp.up_proj", d, s.intermediate, s.mlp_bias);
  projection(gpt ? "mlp.c_proj" : "mlp.down_proj", s.intermediate, d, s.mlp_bias);
}

int64_t rounded(double v, int64_t multiple) {
  return std::max<int64_t>(multiple, static_cast<int64_t>(std::llround(v / multiple)) * multiple);
}

}  // namespace

std::vector<LmShape::Parameter> LmShape::parameters() const {
  std::vector<Parameter> out;
  const size_t last = units() - 1;
  const bool gpt = !swiglu;
  out.push_back({gpt ? "wte.weight" : "embed_tokens.weight", padded_vocab * d_model, 0});
  if (positions > 0) out.push_back({"wpe.weight", positions * d_model, 0});
  for (int64_t i = 0; i < layers; ++i) block_parameters(*this, i, out);
  const size_t norm_unit = tied ? 0 : last;
  out.push_back({gpt ? "ln_f.weight" : "norm.weight", d_model, norm_unit});
  if (gpt) out.push_back({"ln_f.bias", d_model, norm_unit});
  if (!tied) out.push_back({"lm_head.weight", padded_vocab * d_model, last});
  return out;
}

int64_t LmShape::parameter_count() const {
  int64_t n = 0;
  for (const Parameter& p : parameters()) n += p.numel;
  return n;
}

// Note [Activations from the shapes]
// Per token, one block saves for backward (elements, A = heads x head_dim, K = kv_heads x
// head_dim, I = the MLP's width): its two norms' inputs and outputs (4 d_model); the attention's
// projection output (A + 2K), the rotary embedding's inputs and rotated halves (2 (A + K), llama
// only), the scaled-dot-product attention's queries, keys, values and output (A + 2K + A: no
// [T, T] matrix, as the fused kernels keep none) and the output projection's input (A); the MLP's
// SwiGLU gate, its SiLU, the up projection and their product (4 I), or GPT-2's up projection and
// its GELU (2 I). Backward holds one block's worth of gradients at a time. Checkpointed, a block
// keeps only its input (d_model) and one block is recomputed at a time. The output layer
// (models/lm/linear_cross_entropy.h) holds, per row of its chunk, the logits in the compute dtype,
// their log-softmax in fp32 and their gradient in the compute dtype, and for the whole step the
// output weight's gradient in fp32 and h's gradient (d_model, fp32, per token).
LmShape::Activations LmShape::activations(int64_t tokens, int64_t element_bytes,
                                          bool checkpointed) const {
  const int64_t d = d_model, a = heads * head_dim, k = kv_heads * head_dim;
  const int64_t attention =
      swiglu ? (a + 2 * k) + 2 * (a + k) + (2 * a + 2 * k) + a : (a + 2 * k) + (2 * a + 2 * k) + a;
  const int64_t block = 4 * d + attention + (swiglu ? 4 : 2) * intermediate;
  const int64_t blocks = checkpointed ? layers * d + 2 * block : (layers + 1) * block;
  // Embeddings' output, the final norm's input and output: d each.
  const int64_t per_token = (blocks + 3 * d) * element_bytes + 4 * d;
  Activations out;
  out.per_sample = per_token * tokens;
  out.per_chunk_row = padded_vocab * (2 * element_bytes + 4);
  out.fixed = padded_vocab * d * 4;
  return out;
}

LmShape LmShape::scaled(double factor) const {
  LmShape s = *this;
  const int64_t group = std::max<int64_t>(1, heads / std::max<int64_t>(1, kv_heads));
  s.d_model = rounded(static_cast<double>(d_model) * factor, head_dim * group);
  s.heads = s.d_model / head_dim;
  s.kv_heads = std::max<int64_t>(1, s.heads / group);
  s.intermediate = rounded(static_cast<double>(intermediate) * factor, 64);
  s.layers = std::max<int64_t>(1, std::llround(static_cast<double>(layers) * factor));
  return s;
}

}  // namespace models
