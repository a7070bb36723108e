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
  projection(gpt ? "attn.c_attn" : "self_attn.qkv_proj", d, a + 2 * k,
             s.attention_bias || s.qkv_bias);
  projection(gpt ? "attn.c_proj" : "self_attn.o_proj", a, d, s.attention_bias);
  if (s.qk_norm) {  // registered after o_proj (models/block.h)
    add("self_attn.q_norm.weight", s.head_dim);
    add("self_attn.k_norm.weight", s.head_dim);
  }
  // Gemma's post_attention_layernorm follows the attention; its pre-MLP norm has its own name.
  if (s.sandwich_norms) norm("post_attention_layernorm");
  norm(gpt ? "ln_2"
           : (s.sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm"));
  if (s.swiglu) projection("mlp.gate_proj", d, s.intermediate, s.mlp_bias);
  projection(gpt ? "mlp.c_fc" : "mlp.up_proj", d, s.intermediate, s.mlp_bias);
  projection(gpt ? "mlp.c_proj" : "mlp.down_proj", s.intermediate, d, s.mlp_bias);
  if (s.sandwich_norms) norm("post_feedforward_layernorm");
}

// One block's LoRA adapters (models/lm/lora.cpp), in the order named_parameters() lists them: a
// module's adapters follow its children registered before them, so the attention's whole
// projections (gpt's c_attn and c_proj, llama's o_proj) come before llama's q_proj, k_proj and
// v_proj (their rows of the fused qkv_proj, registered on the attention afterwards); then the
// MLP's projections. Each adapter is lora_A [rank, in] and lora_B [rows, rank].
void block_adapters(const LmShape& s, int64_t i, std::vector<LmShape::Parameter>& out) {
  const int64_t d = s.d_model, a = s.heads * s.head_dim, k = s.kv_heads * s.head_dim;
  const bool gpt = !s.swiglu;
  const std::string p = fmt::format("{}.{}.", gpt ? "h" : "layers", i);
  const auto targeted = [&](const std::string& name) {
    return std::find(s.lora_targets.begin(), s.lora_targets.end(), name) != s.lora_targets.end();
  };
  const auto adapter = [&](const std::string& module, int64_t in, int64_t rows) {
    if (!targeted(module.substr(module.rfind('.') + 1))) return;
    const size_t unit = static_cast<size_t>(1 + i);
    out.push_back({p + module + ".lora_A.weight", s.lora_rank * in, unit});
    out.push_back({p + module + ".lora_B.weight", rows * s.lora_rank, unit});
  };
  if (gpt) {
    adapter("attn.c_attn", d, a + 2 * k);
    adapter("attn.c_proj", a, d);
    adapter("mlp.c_fc", d, s.intermediate);
    adapter("mlp.c_proj", s.intermediate, d);
    return;
  }
  adapter("self_attn.o_proj", a, d);
  adapter("self_attn.q_proj", d, a);
  adapter("self_attn.k_proj", d, k);
  adapter("self_attn.v_proj", d, k);
  adapter("mlp.gate_proj", d, s.intermediate);
  adapter("mlp.up_proj", d, s.intermediate);
  adapter("mlp.down_proj", s.intermediate, d);
}

// The base's parameters (without adapters, all of the model's).
std::vector<LmShape::Parameter> base_parameters(const LmShape& s) {
  std::vector<LmShape::Parameter> out;
  const size_t last = s.units() - 1;
  const bool gpt = !s.swiglu;
  out.push_back({gpt ? "wte.weight" : "embed_tokens.weight", s.padded_vocab * s.d_model, 0});
  if (s.positions > 0) out.push_back({"wpe.weight", s.positions * s.d_model, 0});
  for (int64_t i = 0; i < s.layers; ++i) block_parameters(s, i, out);
  const size_t norm_unit = s.tied ? 0 : last;
  out.push_back({gpt ? "ln_f.weight" : "norm.weight", s.d_model, norm_unit});
  if (gpt) out.push_back({"ln_f.bias", s.d_model, norm_unit});
  if (!s.tied) out.push_back({"lm_head.weight", s.padded_vocab * s.d_model, last});
  return out;
}

int64_t count(const std::vector<LmShape::Parameter>& params) {
  int64_t n = 0;
  for (const LmShape::Parameter& p : params) n += p.numel;
  return n;
}

int64_t rounded(double v, int64_t multiple) {
  return std::max<int64_t>(multiple, static_cast<int64_t>(std::llround(v / multiple)) * multiple);
}

}  // namespace

std::vector<LmShape::Parameter> LmShape::parameters() const {
  if (!has_adapters()) return base_parameters(*this);
  std::vector<Parameter> out;
  for (int64_t i = 0; i < layers; ++i) block_adapters(*this, i, out);
  return out;
}

int64_t LmShape::parameter_count() const {
  return count(base_parameters(*this)) + (has_adapters() ? count(parameters()) : 0);
}

int64_t LmShape::frozen_count() const { return count(frozen()); }

std::vector<LmShape::Parameter> LmShape::frozen() const {
  return has_adapters() ? base_parameters(*this) : std::vector<Parameter>{};
}

// Note [Activations from the shapes]
// Per token, one block saves for backward (elements, A = heads x head_dim, K = kv_heads x
// head_dim, I = the MLP's width): its two norms' inputs and outputs (4 d_model; Gemma's four, 8);
// the attention's projection output (A + 2K), the rotary embedding's inputs and rotated halves (2
// (A + K), llama only; Qwen3's q and k norms' inputs and outputs, 2 (A + K) more), the
// scaled-dot-product attention's queries, keys, values and output (A + 2K + A: no [T, T] matrix, as
// the fused kernels keep none) and the output projection's input (A); the MLP's SwiGLU gate, its
// SiLU, the up projection and their product (4 I), or GPT-2's up projection and its GELU (2 I).
// Backward holds one block's worth of gradients at a time. Checkpointed, a block keeps only its
// input (d_model) and one block is recomputed at a time. The output layer
// (models/lm/linear_cross_entropy.h) holds, per row of its chunk, the logits in the compute dtype,
// their log-softmax in fp32 and their gradient in the compute dtype, and for the whole step the
// output weight's gradient in fp32 (none under LoRA: the output layer is frozen) and h's gradient
// (d_model, fp32, per token).
LmShape::Activations LmShape::activations(int64_t tokens, int64_t element_bytes,
                                          bool checkpointed) const {
  const int64_t d = d_model, a = heads * head_dim, k = kv_heads * head_dim;
  const int64_t attention = (swiglu ? (a + 2 * k) + 2 * (a + k) + (2 * a + 2 * k) + a
                                    : (a + 2 * k) + (2 * a + 2 * k) + a) +
                            (qk_norm ? 2 * (a + k) : 0);  // the q and k norms' inputs and outputs
  // Gemma's two norms more: their inputs and outputs (4 d_model).
  const int64_t block = (sandwich_norms ? 8 : 4) * d + attention + (swiglu ? 4 : 2) * intermediate;
  const int64_t blocks = checkpointed ? layers * d + 2 * block : (layers + 1) * block;
  // Embeddings' output, the final norm's input and output: d each.
  const int64_t per_token = (blocks + 3 * d) * element_bytes + 4 * d;
  Activations out;
  out.per_sample = per_token * tokens;
  out.per_chunk_row = padded_vocab * (2 * element_bytes + 4);
  out.fixed = has_adapters() ? 0 : padded_vocab * d * 4;
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
