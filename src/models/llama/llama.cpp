#include "models/llama/llama.h"

#include <ATen/ATen.h>

#include <cmath>

#include "models/block.h"
#include "models/deferred_init.h"
#include "models/embedding.h"
#include "models/rope.h"

namespace models {
namespace {

constexpr double kInitStd = 0.02;  // transformers' initializer_range

LlamaOptions resolved(LlamaOptions o) {
  check_llama_options(o);
  o.kv_heads = o.resolved_kv_heads();
  o.head_dim = o.resolved_head_dim();
  if (o.padded_vocab_size == 0) {
    o.padded_vocab_size = padded_vocab(o.vocab_size);
  }
  return o;
}

// What the language-model base needs: no dropout on the embeddings, as transformers' Llama.
CausalLmDims dims_of(const LlamaOptions& o) {
  return {.family = o.family,
          .vocab_size = o.vocab_size,
          .padded_vocab_size = o.padded_vocab_size,
          .context = o.context,
          .d_model = o.d_model,
          .attention_width = o.heads * o.head_dim,
          .dropout = o.dropout,
          .embedding_dropout = false,
          .checkpoint_activations = o.checkpoint_activations,
          .loss_chunk_rows = o.loss_chunk_rows,
          .tied = o.tie_embeddings,
          .embeddings = {"embed_tokens"},
          .blocks = "layers",
          .lora_split_qkv = true,
          .lora_default_targets = {"q_proj", "k_proj", "v_proj", "o_proj"},
          .hf_prefix = "model."};
}

// The block with Llama's parts and Hugging Face's names (each layer's window and rotary set
// apart).
BlockOptions block_options(const LlamaOptions& o) {
  BlockOptions b;
  b.d_model = o.d_model;
  b.heads = o.heads;
  b.kv_heads = o.kv_heads;
  b.head_dim = o.head_dim;
  b.norm = o.norm_offset ? NormKind::kRmsNormOffset : NormKind::kRmsNorm;
  b.norm_eps = o.rms_norm_eps;
  b.attn_bias = o.attention_bias;
  b.qkv_bias = o.qkv_bias;
  b.qk_norm = o.qk_norm;
  b.mlp = o.geglu ? MlpKind::kGeGlu : MlpKind::kSwiGlu;
  if (o.query_pre_attn_scalar > 0) b.attn_scale = 1.0 / std::sqrt(o.query_pre_attn_scalar);
  b.sandwich_norms = o.sandwich_norms;
  b.mlp_hidden = o.intermediate;
  b.mlp_bias = o.mlp_bias;
  b.causal = true;
  b.names.norm_1 = "input_layernorm";
  b.names.attn = "self_attn";
  b.names.qkv = "qkv_proj";
  b.names.attn_out = "o_proj";
  b.names.norm_2 = "post_attention_layernorm";  // before the MLP
  if (o.sandwich_norms) {  // Gemma's: post_attention_layernorm after the attention
    b.names.post_attn = "post_attention_layernorm";
    b.names.norm_2 = "pre_feedforward_layernorm";
    b.names.post_mlp = "post_feedforward_layernorm";
  }
  b.names.mlp = "mlp";
  b.names.gate = "gate_proj";
  b.names.up = "up_proj";
  b.names.mlp_out = "down_proj";
  return b;
}

// transformers' _init_weights for Llama: projections N(0, 0.02), biases 0 (norms are already 1).
void init_projection(Projection& p) {
  init_parameter(p.weight, [](const at::Tensor& w) { w.normal_(0.0, kInitStd); });
  if (p.bias.defined()) {
    init_parameter(
        p.bias, [](const at::Tensor& b) { b.zero_(); }, /*random=*/false);
  }
}

void init_block(Block& block) {
  for (Projection* p : {&block.qkv(), &block.attn_out(), &block.up(), &block.mlp_out()}) {
    init_projection(*p);
  }
  if (block.options().mlp != MlpKind::kGelu) init_projection(block.gate());
}

}  // namespace

struct Llama::Layers {
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Projection> lm_head;  // untied only
};

Llama::Llama(const LlamaOptions& options) : Llama(Resolved{}, resolved(options)) {}

Llama::Llama(Resolved, const LlamaOptions& o)
    : CausalLm(dims_of(o)), options_(o), layers_(std::make_unique<Layers>()) {
  Layers& l = *layers_;
  // In Hugging Face's order (named_parameters() follows registration).
  // Each module draws as torch::nn's would (Embedding: N(0, 1); Linear: kaiming), then Llama's
  // initialisation over it: the same random stream as before the modules were the project's.
  l.embed_tokens =
      register_module("embed_tokens", std::make_shared<Embedding>(o.padded_vocab_size, o.d_model));
  init_parameter(l.embed_tokens->weight, [](const at::Tensor& w) { w.normal_(0.0, kInitStd); });
  // One rotary scheme for every block, or one for the sliding layers and one for the others
  // (their windows may differ too).
  BlockOptions first = block_options(o);
  const auto rotary = std::make_shared<Rotary>(rope_frequencies(o.head_dim, o.rope));
  const auto sliding_rotary =
      o.sliding_rope ? std::make_shared<Rotary>(rope_frequencies(o.head_dim, *o.sliding_rope))
                     : rotary;
  blocks_ = add_blocks(
      *this, "layers", o.num_layers,
      [&](int64_t i) {
        BlockOptions b = first;
        b.window = o.window_of(i);
        b.position = b.window > 0 ? sliding_rotary : rotary;
        return b;
      },
      init_block);
  l.norm =
      register_module("norm", std::make_shared<Norm>(o.d_model, first.norm, o.rms_norm_eps, false));
  if (!o.tie_embeddings) {
    l.lm_head = register_module("lm_head",
                                std::make_shared<Projection>(o.d_model, o.padded_vocab_size, false,
                                                             WeightLayout::kOutIn, false));
    init_projection(*l.lm_head);
  }
}

Llama::~Llama() = default;

at::Tensor Llama::embed(const at::Tensor& tokens, const at::Tensor& /*positions*/) {
  const at::Tensor x = layers_->embed_tokens->forward(tokens);
  if (!options_.embed_scale) return x;
  // Gemma's sqrt(hidden_size), a float32 scalar cast to the embedding's dtype, as transformers'.
  const at::Tensor scale = at::scalar_tensor(static_cast<float>(std::sqrt(options_.d_model)),
                                             x.options().dtype(at::kFloat));
  return x * scale.to(x.scalar_type());
}

at::Tensor Llama::final_norm(const at::Tensor& x) { return layers_->norm->forward(x); }

at::Tensor Llama::output_weight() const {
  return options_.tie_embeddings ? layers_->embed_tokens->weight : layers_->lm_head->weight;
}

}  // namespace models
