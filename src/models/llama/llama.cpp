#include "models/llama/llama.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

#include "models/block.h"
#include "models/gpt/linear_cross_entropy.h"
#include "models/rope.h"

namespace models {
namespace {

constexpr double kInitStd = 0.02;       // transformers' initializer_range
constexpr int64_t kVocabMultiple = 64;  // padded_vocab_size 0: vocab_size rounded up to this

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("llama: " + message);
}

void require_tokens(const at::Tensor& tokens) {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}", c10::toString(tokens.scalar_type()),
                      tokens.sizes()));
}

LlamaOptions resolved(LlamaOptions o) {
  check_llama_options(o);
  o.kv_heads = o.resolved_kv_heads();
  o.head_dim = o.resolved_head_dim();
  if (o.padded_vocab_size == 0) {
    o.padded_vocab_size = (o.vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  }
  return o;
}

// The block with Llama's parts and Hugging Face's names.
BlockOptions block_options(const LlamaOptions& o) {
  BlockOptions b;
  b.d_model = o.d_model;
  b.heads = o.heads;
  b.kv_heads = o.kv_heads;
  b.head_dim = o.head_dim;
  b.norm = NormKind::kRmsNorm;
  b.norm_eps = o.rms_norm_eps;
  b.attn_bias = o.attention_bias;
  b.mlp = MlpKind::kSwiGlu;
  b.mlp_hidden = o.intermediate;
  b.mlp_bias = o.mlp_bias;
  b.causal = true;
  b.position = std::make_shared<Rotary>(rope_frequencies(o.head_dim, o.rope));
  b.names.norm_1 = "input_layernorm";
  b.names.attn = "self_attn";
  b.names.qkv = "qkv_proj";
  b.names.attn_out = "o_proj";
  b.names.norm_2 = "post_attention_layernorm";
  b.names.mlp = "mlp";
  b.names.gate = "gate_proj";
  b.names.up = "up_proj";
  b.names.mlp_out = "down_proj";
  return b;
}

// transformers' _init_weights for Llama: projections N(0, 0.02), biases 0 (norms are already 1).
void init_block(Block& block) {
  at::NoGradGuard no_grad;
  const bool swiglu = block.options().mlp == MlpKind::kSwiGlu;
  for (Projection* p : {&block.qkv(), &block.attn_out(), &block.up(), &block.mlp_out()}) {
    p->weight.normal_(0.0, kInitStd);
    if (p->bias.defined()) p->bias.zero_();
  }
  if (swiglu) {
    block.gate().weight.normal_(0.0, kInitStd);
    if (block.gate().bias.defined()) block.gate().bias.zero_();
  }
}

}  // namespace

struct Llama::Layers {
  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;  // registered as layers.{i}
  std::shared_ptr<Norm> norm;
  torch::nn::Linear lm_head{nullptr};  // untied only
};

Llama::Llama(const LlamaOptions& options)
    : options_(resolved(options)), own_chunk_rows_(options.loss_chunk_rows),
      layers_(std::make_unique<Layers>()) {
  const LlamaOptions& o = options_;
  Layers& l = *layers_;
  // In Hugging Face's order (named_parameters() follows registration).
  l.embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(o.padded_vocab_size, o.d_model));
  {
    at::NoGradGuard no_grad;
    l.embed_tokens->weight.normal_(0.0, kInitStd);
  }
  l.blocks = add_blocks(*this, "layers", o.num_layers, block_options(o), init_block);
  l.norm = register_module(
      "norm", std::make_shared<Norm>(o.d_model, NormKind::kRmsNorm, o.rms_norm_eps, false));
  if (!o.tie_embeddings) {
    l.lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.padded_vocab_size).bias(false)));
    at::NoGradGuard no_grad;
    l.lm_head->weight.normal_(0.0, kInitStd);
  }
}

Llama::~Llama() = default;

at::Tensor Llama::output_weight() const {
  return options_.tie_embeddings ? layers_->embed_tokens->weight : layers_->lm_head->weight;
}

at::Tensor Llama::embed(const at::Tensor& tokens, int64_t past) const {
  require_tokens(tokens);
  const int64_t t = tokens.size(1);
  require(t >= 1 && past + t <= options_.context,
          fmt::format("{} cached + {} new positions; model.context = {} are allowed", past, t,
                      options_.context));
  return layers_->embed_tokens->forward(tokens);
}

size_t Llama::output_unit() const {
  return options_.tie_embeddings ? 0 : 1 + layers_->blocks.size();
}

std::vector<std::vector<std::string>> Llama::parameter_units() const {
  std::vector<std::vector<std::string>> units(1 + layers_->blocks.size() +
                                              (options_.tie_embeddings ? 0 : 1));
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    size_t unit = output_unit();  // norm, lm_head
    if (name.rfind("embed_tokens.", 0) == 0) unit = 0;
    if (name.rfind("layers.", 0) == 0) unit = 1 + std::stoul(name.substr(7, name.find('.', 7) - 7));
    units[unit].push_back(name);
  }
  return units;
}

at::Tensor Llama::trunk(const at::Tensor& tokens) {
  const double p = is_training() ? options_.dropout : 0.0;
  if (gate_ != nullptr) gate_->enter(0);
  at::Tensor x = embed(tokens, 0);
  if (gate_ != nullptr) x = gate_->leave(0, x);
  x = run_blocks(layers_->blocks, x, p, options_.checkpoint_activations, nullptr, gate_, 1);
  if (gate_ != nullptr) gate_->enter(output_unit());
  return layers_->norm->forward(x);
}

at::Tensor Llama::forward(const at::Tensor& tokens) {
  return leave_output(at::linear(trunk(tokens), output_weight()));
}

at::Tensor Llama::forward_cached(const at::Tensor& tokens, KvCache& cache) {
  const at::Tensor x = embed(tokens, cache.length());
  const at::Tensor h = run_blocks_cached(layers_->blocks, x, cache);
  return at::linear(layers_->norm->forward(h), output_weight());
}

at::Tensor Llama::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  require(targets.sizes() == tokens.sizes() && targets.scalar_type() == at::kLong,
          fmt::format("targets must be int64 {} like the tokens, got {} {}", tokens.sizes(),
                      c10::toString(targets.scalar_type()), targets.sizes()));
  const at::Tensor h = trunk(tokens);
  // The output layer and the loss in chunks of positions (Note [Chunked output layer]); the
  // padded rows are masked out there.
  return leave_output(linear_cross_entropy(h.reshape({-1, options_.d_model}), output_weight(),
                                           targets.reshape({-1}), options_.vocab_size,
                                           options_.loss_chunk_rows));
}

int64_t Llama::loss_chunk_rows(int64_t rows) const {
  return linear_cross_entropy_chunk_rows(rows, options_.padded_vocab_size,
                                         options_.loss_chunk_rows);
}

void Llama::set_loss_chunk_rows(int64_t rows) {
  options_.loss_chunk_rows = rows > 0 ? rows : own_chunk_rows_;
}

double Llama::flops_per_token(int64_t positions) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  if (!options_.tie_embeddings) n -= layers_->embed_tokens->weight.numel();  // a lookup
  const int64_t attn_width = options_.heads * options_.head_dim;
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(options_.num_layers * attn_width * positions);
}

}  // namespace models
