// Gpt: a decoder-only transformer language model in the shape of GPT-2.
//
//   tokens [n, T] -> wte(tokens) + wpe(0..T-1) -> dropout
//     -> num_layers x Block (models/block.h's defaults):  x = x + attn(ln_1(x));  x += mlp(ln_2(x))
//          attn: qkv = Linear(C, 3C) -> heads -> causal scaled_dot_product_attention -> Linear(C,
//          C) mlp:  Linear(C, 4C) -> GELU (tanh approximation) -> Linear(4C, C)
//     -> ln_f -> logits = x @ wte^T (the output projection is tied to the token embedding)
//   loss: mean next-token cross-entropy over every position, on the first vocab_size logits
//         (the padded rows of wte are never a target and never predicted), computed by
//         linear_cross_entropy in chunks of positions, so the whole logits are never held
//
// Initialisation as GPT-2: Linear and Embedding weights N(0, 0.02), the two residual output
// projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 * num_layers)), biases zero,
// LayerNorm weight 1 and bias 0. Parameter names (as in named_parameters(), also the checkpoint
// and reference-test keys) follow GPT-2's: wte.weight, wpe.weight, h.{i}.ln_1.weight,
// h.{i}.attn.c_attn.weight, h.{i}.attn.c_proj.weight, h.{i}.ln_2.weight, h.{i}.mlp.c_fc.weight,
// h.{i}.mlp.c_proj.weight (each with .bias), ln_f.weight, ln_f.bias. Linear weights are
// [out, in] as in torch.nn.Linear. LayerNorm eps 1e-5; attention scale 1/sqrt(d_model / heads).
//
// Dropout (model.dropout, training mode only), where GPT-2 has it: after the embeddings, on the
// attention probabilities, and on each residual branch's output (after attn.c_proj, mlp.c_proj).
//
// Activation checkpointing (set_checkpoint_activations): each block keeps only its input in
// forward and is recomputed during backward (with the same dropout masks), trading compute for
// memory without changing the result.
//
// Forward, the chunked loss, KV-cache decoding, FLOPs per token, activation checkpointing and the
// parameter units (0 wte, wpe and ln_f; 1 .. num_layers the blocks h.{i}) are the language-model
// base's (models/lm/causal_lm.h); this class holds GPT-2's parts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/lm/causal_lm.h"

namespace models {

struct GptOptions {
  int64_t vocab_size = 0;         // token ids the data holds (targets are below it)
  int64_t padded_vocab_size = 0;  // rows of wte: vocab_size rounded up (0: to a multiple of 64)
  int64_t context = 0;            // positions (rows of wpe); inputs may be shorter
  int64_t num_layers = 0;
  int64_t heads = 0;
  int64_t d_model = 0;
  double dropout = 0.0;
  bool checkpoint_activations = false;
  int64_t loss_chunk_rows = 0;  // positions per chunk of the output layer in loss()
                                // (0: linear_cross_entropy's default, 256 MiB of fp32 logits)
};

// The preset's dimensions: gpt2 (124M: 12 layers, 12 heads, 768 wide, 1024 positions, vocab
// 50257), gpt2-medium (350M: 24, 16, 1024, 1024, 50257), tiny (tests: 2 layers, 4 heads, 64 wide,
// 64 positions, vocab 256). Throws std::invalid_argument naming model.preset otherwise.
GptOptions gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

class Gpt final : public CausalLm {
 public:
  // Throws std::invalid_argument naming the model key for inconsistent options (heads not
  // dividing d_model, a zero dimension).
  explicit Gpt(const GptOptions& options);
  ~Gpt() override;
  // As constructed, padded_vocab_size resolved (checkpoint_activations and loss_chunk_rows as
  // set since: CausalLm's accessors).
  const GptOptions& options() const { return options_; }
  // Hugging Face's tensors as rows of the parameters (gpt_hf_map; defined beside it in
  // hf_gpt2.cpp).
  HfMap hf_map(const ParameterShapes& shapes) const override;

 private:
  // The submodules, typed (defined in gpt.cpp so that this header stays free of the nn module
  // headers). They are registered on this module, which owns them.
  struct Layers;
  struct Resolved {};  // the options are checked and resolved
  Gpt(Resolved, const GptOptions& options);

  // wte(tokens) + wpe(positions).
  at::Tensor embed(const at::Tensor& tokens, const at::Tensor& positions) override;
  at::Tensor final_norm(const at::Tensor& x) override;
  at::Tensor output_weight() const override;  // wte: tied

  GptOptions options_;
  std::unique_ptr<Layers> layers_;
};

}  // namespace models
