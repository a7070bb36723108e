#include "models/gpt/gpt.h"

#include "models/block.h"
#include "models/gpt/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <stdexcept>
#include <utility>

namespace models {
namespace {

constexpr double kLayerNormEps = 1e-5;  // GPT-2's
constexpr double kInitStd = 0.02;       // GPT-2's
constexpr int64_t kVocabMultiple = 64;  // padded_vocab_size 0: vocab_size rounded up to this

struct Preset {
  const char* name;
  int64_t num_layers, heads, d_model, context, vocab_size;
};
constexpr Preset kPresets[] = {
    {"gpt2", 12, 12, 768, 1024, 50257},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257},
    {"tiny", 2, 4, 64, 64, 256},
};

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("gpt: " + message);
}

void require_positive(const char* key, int64_t value) {
  require(value > 0, fmt::format("{} must be positive, got {}", key, value));
}

// GPT-2's block (the block's defaults), named as GPT-2's h.{i}.*.
BlockOptions gpt_block(const GptOptions& o) {
  BlockOptions b;
  b.d_model = o.d_model;
  b.heads = o.heads;
  b.norm_eps = kLayerNormEps;
  return b;
}

// GPT-2's initialisation; the residual output projections scaled by 1 / sqrt(2 num_layers).
void init_gpt2(Block& block, double residual_std) {
  at::NoGradGuard no_grad;
  for (Projection* p : {&block.qkv(), &block.attn_out(), &block.up(), &block.mlp_out()}) {
    const bool residual = p == &block.attn_out() || p == &block.mlp_out();
    p->weight.normal_(0.0, residual ? residual_std : kInitStd);
    p->bias.zero_();
  }
}

}  // namespace

struct Gpt::Layers {
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<std::shared_ptr<Block>> blocks;  // also registered as h.{i}
  torch::nn::LayerNorm ln_f{nullptr};
};

GptOptions gpt_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    GptOptions o;
    o.num_layers = p.num_layers;
    o.heads = p.heads;
    o.d_model = p.d_model;
    o.context = p.context;
    o.vocab_size = p.vocab_size;
    return o;
  }
  throw std::invalid_argument(fmt::format("model.preset: unknown preset '{}'; known presets: {}",
                                          name, fmt::join(gpt_preset_names(), ", ")));
}

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Gpt::Gpt(const GptOptions& o)
    : options_(o), own_chunk_rows_(o.loss_chunk_rows), layers_(std::make_unique<Layers>()) {
  require_positive("model.num_layers", o.num_layers);
  require_positive("model.heads", o.heads);
  require_positive("model.d_model", o.d_model);
  require_positive("model.context", o.context);
  require_positive("data.vocab_size", o.vocab_size);
  require(o.d_model % o.heads == 0,
          fmt::format("model.heads ({}) must divide model.d_model ({})", o.heads, o.d_model));
  require(o.dropout >= 0.0 && o.dropout < 1.0,
          fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));
  if (options_.padded_vocab_size == 0) {
    options_.padded_vocab_size =
        (o.vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  }
  require(options_.padded_vocab_size >= o.vocab_size,
          fmt::format("padded_vocab_size ({}) must be at least data.vocab_size ({})",
                      options_.padded_vocab_size, o.vocab_size));

  const int64_t d = o.d_model;
  Layers& l = *layers_;
  l.wte = register_module("wte", torch::nn::Embedding(options_.padded_vocab_size, d));
  l.wpe = register_module("wpe", torch::nn::Embedding(o.context, d));
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(o.num_layers));
  l.blocks = add_blocks(*this, "h", o.num_layers, gpt_block(o),
                        [residual_std](Block& block) { init_gpt2(block, residual_std); });
  l.ln_f = register_module(
      "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(kLayerNormEps)));
  at::NoGradGuard no_grad;
  l.wte->weight.normal_(0.0, kInitStd);
  l.wpe->weight.normal_(0.0, kInitStd);
}

Gpt::~Gpt() = default;

at::Tensor Gpt::forward(const at::Tensor& tokens) {
  const at::Tensor logits = at::linear(hidden(tokens), layers_->wte->weight);  // tied output
  return gate_ != nullptr ? gate_->leave(0, logits) : logits;
}

std::vector<std::vector<std::string>> Gpt::parameter_units() const {
  std::vector<std::vector<std::string>> units(1 + layers_->blocks.size());
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    size_t unit = 0;
    if (name.rfind("h.", 0) == 0) unit = 1 + std::stoul(name.substr(2, name.find('.', 2) - 2));
    units[unit].push_back(name);
  }
  return units;
}

at::Tensor Gpt::hidden(const at::Tensor& tokens) {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}", c10::toString(tokens.scalar_type()),
                      tokens.sizes()));
  const int64_t t = tokens.size(1);
  require(t >= 1 && t <= options_.context,
          fmt::format("samples of {} tokens; 1 to model.context = {} are allowed", t,
                      options_.context));
  Layers& l = *layers_;
  const double p = is_training() ? options_.dropout : 0.0;
  // Units (ddp.shard: parameters): the embeddings' unit 0 around the embeddings and again from
  // ln_f to the output layer (the caller leaves it), block i as unit 1 + i.
  if (gate_ != nullptr) gate_->enter(0);
  at::Tensor x = l.wte->forward(tokens) + l.wpe->forward(at::arange(t, tokens.options()));
  x = at::dropout(x, p, p > 0);
  if (gate_ != nullptr) x = gate_->leave(0, x);
  x = run_blocks(l.blocks, x, p, options_.checkpoint_activations, nullptr, gate_, 1);
  if (gate_ != nullptr) gate_->enter(0);
  return l.ln_f->forward(x);
}

at::Tensor Gpt::forward_cached(const at::Tensor& tokens, KvCache& cache) {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}", c10::toString(tokens.scalar_type()),
                      tokens.sizes()));
  Layers& l = *layers_;
  if (cache.keys.empty()) {
    cache.keys.resize(l.blocks.size());
    cache.values.resize(l.blocks.size());
  }
  require(cache.keys.size() == l.blocks.size(), "a KV cache of another model");
  const int64_t past = cache.length(), t = tokens.size(1);
  require(t >= 1 && past + t <= options_.context,
          fmt::format("{} cached + {} new positions; model.context = {} are allowed", past, t,
                      options_.context));
  // The position embedding continues where the cache ends.
  at::Tensor x =
      l.wte->forward(tokens) + l.wpe->forward(at::arange(past, past + t, tokens.options()));
  return at::linear(l.ln_f->forward(run_blocks_cached(l.blocks, x, cache)), l.wte->weight);
}

at::Tensor Gpt::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  require(targets.sizes() == tokens.sizes() && targets.scalar_type() == at::kLong,
          fmt::format("targets must be int64 {} like the tokens, got {} {}", tokens.sizes(),
                      c10::toString(targets.scalar_type()), targets.sizes()));
  // The output layer and the loss in chunks of positions (Note [Chunked output layer]): the
  // [positions, vocab] logits are never whole. The padded rows of wte are masked out there.
  const at::Tensor h = hidden(tokens);
  const at::Tensor loss =
      linear_cross_entropy(h.reshape({-1, options_.d_model}), layers_->wte->weight,
                           targets.reshape({-1}), options_.vocab_size, options_.loss_chunk_rows);
  return gate_ != nullptr ? gate_->leave(0, loss) : loss;
}

int64_t Gpt::loss_chunk_rows(int64_t rows) const {
  return linear_cross_entropy_chunk_rows(rows, options_.padded_vocab_size,
                                         options_.loss_chunk_rows);
}

void Gpt::set_loss_chunk_rows(int64_t rows) {
  options_.loss_chunk_rows = rows > 0 ? rows : own_chunk_rows_;
}

double Gpt::flops_per_token(int64_t positions) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  n -= layers_->wpe->weight.numel();
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(options_.num_layers * options_.d_model * positions);
}

}  // namespace models
