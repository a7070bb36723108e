#include "models/gpt/gpt.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "models/block.h"
#include "models/deferred_init.h"
#include "models/embedding.h"
#include "models/lm/presets.h"

namespace models {
namespace {

constexpr double kGpt2NormEps = 1e-5;  // GPT-2's
constexpr double kGpt2InitStd = 0.02;  // GPT-2's

struct GptPreset {
  const char* name;
  int64_t num_layers, heads, d_model, context, vocab_size;
};
constexpr GptPreset kGptPresets[] = {
    {"gpt2", 12, 12, 768, 1024, 50257},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257},
    {"tiny", 2, 4, 64, 64, 256},
};

void require_gpt(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("gpt: " + message);
}

void require_positive_gpt(const char* key, int64_t value) {
  require_gpt(value > 0, fmt::format("{} must be positive, got {}", key, value));
}

// GPT-2's block (the block's defaults), named as GPT-2's h.{i}.*.
BlockOptions gpt_block(const GptOptions& o) {
  BlockOptions b;
  b.d_model = o.d_model;
  b.heads = o.heads;
  b.norm_eps = kGpt2NormEps;
  return b;
}

// GPT-2's initialisation; the residual output projections scaled by 1 / sqrt(2 num_layers).
void init_gpt2(Block& block, double residual_std) {
  for (Projection* p : {&block.qkv(), &block.attn_out(), &block.up(), &block.mlp_out()}) {
    const bool residual = p == &block.attn_out() || p == &block.mlp_out();
    const double std = residual ? residual_std : kGpt2InitStd;
    init_parameter(p->weight, [std](const at::Tensor& w) { w.normal_(0.0, std); });
    init_parameter(
        p->bias, [](const at::Tensor& b) { b.zero_(); }, /*random=*/false);
  }
}

// `o` checked (the model keys named), with padded_vocab_size resolved.
GptOptions resolved(GptOptions o) {
  require_positive_gpt("model.num_layers", o.num_layers);
  require_positive_gpt("model.heads", o.heads);
  require_positive_gpt("model.d_model", o.d_model);
  require_positive_gpt("model.context", o.context);
  require_positive_gpt("data.vocab_size", o.vocab_size);
  require_gpt(o.d_model % o.heads == 0,
              fmt::format("model.heads ({}) must divide model.d_model ({})", o.heads, o.d_model));
  require_gpt(o.dropout >= 0.0 && o.dropout < 1.0,
              fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));
  if (o.padded_vocab_size == 0) {
    o.padded_vocab_size = padded_vocab(o.vocab_size);
  }
  require_gpt(o.padded_vocab_size >= o.vocab_size,
              fmt::format("padded_vocab_size ({}) must be at least data.vocab_size ({})",
                          o.padded_vocab_size, o.vocab_size));
  return o;
}

// What the language-model base needs: GPT-2's tied output, dropout after the embeddings.
CausalLmDims dims_of(const GptOptions& o) {
  return {.family = "gpt",
          .vocab_size = o.vocab_size,
          .padded_vocab_size = o.padded_vocab_size,
          .context = o.context,
          .d_model = o.d_model,
          .attention_width = o.d_model,
          .dropout = o.dropout,
          .embedding_dropout = true,
          .checkpoint_activations = o.checkpoint_activations,
          .loss_chunk_rows = o.loss_chunk_rows,
          .tied = true,
          .embeddings = {"wte", "wpe"},
          .blocks = "h",
          .lora_split_qkv = false,
          .lora_default_targets = {"c_attn"},
          .hf_prefix = "transformer.",
          .learned_positions = true};
}

}  // namespace

struct Gpt::Layers {
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Norm> ln_f;
};

GptOptions gpt_preset(const std::string& name) {
  const GptPreset& p = find_preset(kGptPresets, name, "gpt");
  GptOptions o;
  o.num_layers = p.num_layers;
  o.heads = p.heads;
  o.d_model = p.d_model;
  o.context = p.context;
  o.vocab_size = p.vocab_size;
  return o;
}

std::vector<std::string> gpt_preset_names() { return preset_names_of(kGptPresets); }

Gpt::Gpt(const GptOptions& options) : Gpt(Resolved{}, resolved(options)) {}

Gpt::Gpt(Resolved, const GptOptions& o)
    : CausalLm(dims_of(o)), options_(o), layers_(std::make_unique<Layers>()) {
  const int64_t d = o.d_model;
  Layers& l = *layers_;
  // The modules draw as torch::nn's would (Embedding: N(0, 1)); GPT-2's initialisation follows.
  l.wte = register_module("wte", std::make_shared<Embedding>(o.padded_vocab_size, d));
  l.wpe = register_module("wpe", std::make_shared<Embedding>(o.context, d));
  const double residual_std = kGpt2InitStd / std::sqrt(2.0 * static_cast<double>(o.num_layers));
  blocks_ = add_blocks(*this, "h", o.num_layers, gpt_block(o),
                       [residual_std](Block& block) { init_gpt2(block, residual_std); });
  l.ln_f =
      register_module("ln_f", std::make_shared<Norm>(d, NormKind::kLayerNorm, kGpt2NormEps, false));
  for (Embedding* e : {l.wte.get(), l.wpe.get()}) {
    init_parameter(e->weight, [](const at::Tensor& w) { w.normal_(0.0, kGpt2InitStd); });
  }
}

Gpt::~Gpt() = default;

at::Tensor Gpt::embed(const at::Tensor& tokens, const at::Tensor& positions) {
  return layers_->wte->forward(tokens) + layers_->wpe->forward(positions);
}

at::Tensor Gpt::final_norm(const at::Tensor& x) { return layers_->ln_f->forward(x); }

at::Tensor Gpt::output_weight() const { return layers_->wte->weight; }

}  // namespace models
