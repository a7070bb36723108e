// Llama: a decoder-only transformer language model in the shape of Llama 2/3, SmolLM and their
// kin, built of the shared transformer block (models/block.h) with these parts:
//
//   tokens [n, T] -> embed_tokens(tokens)
//     -> num_layers x Block:  x = x + attn(rms_norm(x));  x = x + swiglu(rms_norm(x))
//          attn: q [heads], k, v [kv_heads] (grouped-query: kv head g serves query heads
//                g * heads/kv_heads ...), each head_dim wide, from one projection qkv_proj;
//                rotary embedding on q and k (theta, optional llama3 frequency scaling,
//                models/rope.h); causal scaled_dot_product_attention, scale 1/sqrt(head_dim);
//                o_proj back to d_model
//          mlp:  down_proj(silu(gate_proj(x)) * up_proj(x)), intermediate wide
//     -> norm (RMSNorm) -> logits = x @ W^T, W = lm_head.weight, or embed_tokens.weight when tied
//   loss: mean next-token cross-entropy over every position on the first vocab_size logits, by
//         linear_cross_entropy in chunks of positions (the logits are never whole; the padded
//         rows never a target and never predicted).
// RMSNorm: x / sqrt(mean(x^2) + rms_norm_eps) * weight. No biases unless attention_bias (qkv_proj,
// o_proj) or mlp_bias (gate_proj, up_proj, down_proj). Gemma 3's options (LlamaOptions) change
// the parts, not this outline: RMSNorm times (1 + weight), four norms a block
// (input_layernorm, post_attention_layernorm after the attention, pre_feedforward_layernorm,
// post_feedforward_layernorm), GeGLU, q and k norms, the embedding times sqrt(d_model), another
// attention scale and the sliding layers' own rotary.
//
// Parameter names (named_parameters(), checkpoints, the reference test) are Hugging Face's
// without the "model." prefix, but for the fused query/key/value projection: embed_tokens.weight,
// layers.{i}.input_layernorm.weight, layers.{i}.self_attn.qkv_proj.weight [(heads + 2 kv_heads)
// head_dim, d_model] (q_proj's rows, then k_proj's, then v_proj's), layers.{i}.self_attn.o_proj.
// weight, layers.{i}.post_attention_layernorm.weight, layers.{i}.mlp.{gate,up,down}_proj.weight,
// norm.weight, lm_head.weight (untied only). Linear weights are [out, in].
//
// Initialisation as transformers' LlamaForCausalLM: linear and embedding weights N(0, 0.02),
// biases zero, norms one. Dropout (model.dropout, training only) where the block has it: the
// attention probabilities and each branch's output. Activation checkpointing recomputes each
// block in backward (models/activation_checkpoint.h).
//
// Forward, the chunked loss, KV-cache decoding, FLOPs per token, activation checkpointing and the
// parameter units (0 embed_tokens, 1 .. num_layers the blocks layers.{i}, then norm and lm_head;
// tied, norm joins unit 0) are the language-model base's (models/lm/causal_lm.h); this class
// holds Llama's parts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/llama/llama_options.h"
#include "models/lm/causal_lm.h"

namespace models {

class Llama final : public CausalLm {
 public:
  // Throws std::invalid_argument naming the model key for inconsistent options
  // (check_llama_options).
  explicit Llama(const LlamaOptions& options);
  ~Llama() override;
  // As constructed, padded_vocab_size, kv_heads and head_dim resolved (checkpoint_activations
  // and loss_chunk_rows as set since: CausalLm's accessors).
  const LlamaOptions& options() const { return options_; }
  // Hugging Face's tensors as rows of the parameters (llama_hf_map; defined beside it in
  // hf_llama.cpp).
  HfMap hf_map(const ParameterShapes& shapes) const override;

 private:
  struct Layers;       // the submodules, typed (llama.cpp)
  struct Resolved {};  // the options are checked and resolved
  Llama(Resolved, const LlamaOptions& options);

  // embed_tokens(tokens): the positions enter attention (rotary), not the embedding.
  at::Tensor embed(const at::Tensor& tokens, const at::Tensor& positions) override;
  at::Tensor final_norm(const at::Tensor& x) override;
  at::Tensor output_weight() const override;  // embed_tokens when tied, else lm_head

  LlamaOptions options_;
  std::unique_ptr<Layers> layers_;
};

}  // namespace models
