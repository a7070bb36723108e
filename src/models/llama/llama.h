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
// o_proj) or mlp_bias (gate_proj, up_proj, down_proj).
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
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/capabilities.h"
#include "models/language_model.h"
#include "models/llama/llama_options.h"

namespace models {

class Llama final : public LanguageModel,
                    public ActivationCheckpointing,
                    public ChunkedLoss,
                    public ParameterUnits {
 public:
  // Throws std::invalid_argument naming the model key for inconsistent options
  // (check_llama_options).
  explicit Llama(const LlamaOptions& options);
  ~Llama() override;
  // logits [n, T, padded_vocab_size] for tokens int64 [n, T] (T <= context).
  at::Tensor forward(const at::Tensor& tokens) override;
  at::Tensor forward_cached(const at::Tensor& tokens, KvCache& cache) override;
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) override;
  void set_checkpoint_activations(bool on) override { options_.checkpoint_activations = on; }
  bool checkpoint_activations() const override { return options_.checkpoint_activations; }
  // 6 N + 12 L (heads head_dim) T; N counts embed_tokens only when it is also the output layer.
  double flops_per_token(int64_t positions) const override;
  int64_t loss_rows(const at::Tensor& tokens) const override { return tokens.numel(); }
  int64_t loss_chunk_rows(int64_t rows) const override;
  void set_loss_chunk_rows(int64_t rows) override;
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t context() const override { return options_.context; }
  const LlamaOptions& options() const { return options_; }
  // Units (ddp.shard: parameters): 0 embed_tokens, 1 .. num_layers the blocks layers.{i}, then
  // norm and lm_head; tied, norm joins unit 0, which the output layer enters again.
  std::vector<std::vector<std::string>> parameter_units() const override;
  void set_unit_gate(UnitGate* gate) override { gate_ = gate; }

 private:
  struct Layers;  // the submodules, typed (llama.cpp)

  at::Tensor embed(const at::Tensor& tokens, int64_t past) const;
  at::Tensor output_weight() const;
  size_t output_unit() const;
  // norm's output: everything before the output layer, with the output unit entered (gate).
  at::Tensor trunk(const at::Tensor& tokens);
  at::Tensor leave_output(const at::Tensor& x) const {
    return gate_ != nullptr ? gate_->leave(output_unit(), x) : x;
  }

  LlamaOptions options_;  // padded_vocab_size, kv_heads and head_dim resolved
  int64_t own_chunk_rows_ = 0;
  std::unique_ptr<Layers> layers_;
  UnitGate* gate_ = nullptr;  // ddp.shard: parameters (set by the trainer)
};

}  // namespace models
