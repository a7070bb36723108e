#include "models/sequence.h"

#include "models/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace models {
namespace {

constexpr double kLayerNormEps = 1e-5;
constexpr double kPosInitStd = 0.02;

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("sequence: " + message);
}

void require_positive(const char* key, int64_t value) {
  require(value > 0, fmt::format("{} must be positive, got {}", key, value));
}

}  // namespace

struct SequenceForecaster::Layers {
  // One pre-LayerNorm encoder block (registered as blocks.{i}.ln_1, .attn.qkv, .attn.proj, ...).
  struct Block {
    torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
    torch::nn::Linear qkv{nullptr}, attn_proj{nullptr}, fc{nullptr}, mlp_proj{nullptr};
  };

  torch::nn::LSTM lstm{nullptr};       // cell lstm
  torch::nn::Linear in_proj{nullptr};  // cell transformer, down to ln_f
  at::Tensor pos;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};

SequenceForecaster::SequenceForecaster(const SequenceOptions& o)
    : options_(o), layers_(std::make_shared<Layers>()) {
  require_positive("data.features (input columns)", o.features);
  require_positive("data.window", o.window);
  require_positive("data.horizon", o.horizon);
  require(o.targets > 0,
          fmt::format("data.targets must name at least one target column, got {}", o.targets));
  require_positive("model.num_layers", o.num_layers);
  require(o.dropout >= 0.0 && o.dropout < 1.0,
          fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));

  Layers& l = *layers_;
  int64_t width = 0;  // of the encoder's output, the head's input
  if (o.cell == SequenceCell::kLstm) {
    require_positive("model.hidden_dim", o.hidden_dim);
    // Dropout acts between layers only, so one layer has none (torch.nn.LSTM warns otherwise).
    l.lstm =
        register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(o.features, o.hidden_dim)
                                                    .num_layers(o.num_layers)
                                                    .batch_first(true)
                                                    .dropout(o.num_layers > 1 ? o.dropout : 0.0)));
    width = o.hidden_dim;
  } else {
    require_positive("model.d_model", o.d_model);
    require_positive("model.heads", o.heads);
    require(o.d_model % o.heads == 0,
            fmt::format("model.heads ({}) must divide model.d_model ({})", o.heads, o.d_model));
    const int64_t d = o.d_model;
    const auto layer_norm = [d] {
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(kLayerNormEps));
    };
    l.in_proj = register_module("in_proj", torch::nn::Linear(o.features, d));
    {
      at::NoGradGuard no_grad;
      l.pos = register_parameter("pos", at::empty({o.window, d}).normal_(0.0, kPosInitStd));
    }
    auto blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.num_layers; ++i) {
      auto block = std::make_shared<torch::nn::Module>();
      auto attn = std::make_shared<torch::nn::Module>();
      auto mlp = std::make_shared<torch::nn::Module>();
      Layers::Block b;
      b.ln_1 = block->register_module("ln_1", layer_norm());
      block->register_module("attn", attn);
      b.qkv = attn->register_module("qkv", torch::nn::Linear(d, 3 * d));
      b.attn_proj = attn->register_module("proj", torch::nn::Linear(d, d));
      b.ln_2 = block->register_module("ln_2", layer_norm());
      block->register_module("mlp", mlp);
      b.fc = mlp->register_module("fc", torch::nn::Linear(d, 4 * d));
      b.mlp_proj = mlp->register_module("proj", torch::nn::Linear(4 * d, d));
      blocks->push_back(block);
      l.blocks.push_back(std::move(b));
    }
    l.ln_f = register_module("ln_f", layer_norm());
    width = d;
  }
  l.head = register_module("head", torch::nn::Linear(width, o.horizon * o.targets));
}

at::Tensor SequenceForecaster::forward(const at::Tensor& inputs) {
  if (inputs.dim() != 3 || inputs.size(2) != options_.features) {
    throw std::invalid_argument(fmt::format("sequence: inputs must be [n, T, {}], got {}",
                                            options_.features, inputs.sizes()));
  }
  const at::Tensor last =
      options_.cell == SequenceCell::kLstm ? encode_lstm(inputs) : encode_transformer(inputs);
  return linear(layers_->head, last).view({inputs.size(0), options_.horizon, options_.targets});
}

at::Tensor SequenceForecaster::encode_lstm(const at::Tensor& inputs) {
  const at::Tensor out = std::get<0>(layers_->lstm->forward(inputs));  // [n, T, hidden_dim]
  return out.select(1, -1);
}

at::Tensor SequenceForecaster::encode_transformer(const at::Tensor& inputs) {
  Layers& l = *layers_;
  const int64_t n = inputs.size(0), len = inputs.size(1);
  const int64_t d = options_.d_model, heads = options_.heads;
  if (len == 0 || len > options_.window) {
    throw std::invalid_argument(
        fmt::format("sequence: transformer inputs have {} steps; 1 to data.window = {} are allowed",
                    len, options_.window));
  }
  const bool train = is_training();
  const double p = train ? options_.dropout : 0.0;
  at::Tensor x = linear(l.in_proj, inputs) + l.pos.narrow(0, 0, len);
  x = at::dropout(x, p, train);
  const auto split_heads = [&](const at::Tensor& t) {
    return t.view({n, len, heads, d / heads}).transpose(1, 2);  // [n, heads, T, d / heads]
  };
  for (Layers::Block& b : l.blocks) {
    const auto qkv = linear(b.qkv, b.ln_1->forward(x)).split(d, -1);
    const at::Tensor a = at::scaled_dot_product_attention(split_heads(qkv[0]), split_heads(qkv[1]),
                                                          split_heads(qkv[2]), /*attn_mask=*/{}, p,
                                                          /*is_causal=*/false);
    x = x + at::dropout(linear(b.attn_proj, a.transpose(1, 2).reshape({n, len, d})), p, train);
    const at::Tensor h = gelu(linear(b.fc, b.ln_2->forward(x)), GeluApprox::kNone);  // exact (erf)
    x = x + at::dropout(linear(b.mlp_proj, h), p, train);
  }
  return l.ln_f->forward(x).select(1, -1);
}

at::Tensor SequenceForecaster::loss(const at::Tensor& inputs, const at::Tensor& targets) {
  const at::Tensor out = forward(inputs);
  if (targets.sizes() != out.sizes()) {
    throw std::invalid_argument(
        fmt::format("sequence: targets must be {}, got {}", out.sizes(), targets.sizes()));
  }
  return at::mse_loss(out, targets);
}

}  // namespace models
