#include "models/sequence.h"

#include "models/block.h"
#include "models/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace models {
namespace {

constexpr double kSequenceNormEps = 1e-5;
constexpr double kPosInitStd = 0.02;

void require_sequence(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("sequence: " + message);
}

void require_positive_sequence(const char* key, int64_t value) {
  require_sequence(value > 0, fmt::format("{} must be positive, got {}", key, value));
}

// The encoder block: GPT-2's, without the causal mask and with exact (erf) GELU, named
// blocks.{i}.{ln_1, attn.qkv, attn.proj, ln_2, mlp.fc, mlp.proj}.
BlockOptions encoder_block(const SequenceOptions& o) {
  BlockOptions b;
  b.d_model = o.d_model;
  b.heads = o.heads;
  b.norm_eps = kSequenceNormEps;
  b.causal = false;
  b.gelu = GeluApprox::kNone;
  b.names.qkv = "qkv";
  b.names.attn_out = "proj";
  b.names.up = "fc";
  b.names.mlp_out = "proj";
  return b;
}

}  // namespace

struct SequenceForecaster::Layers {
  torch::nn::LSTM lstm{nullptr};       // cell lstm
  torch::nn::Linear in_proj{nullptr};  // cell transformer, down to ln_f
  at::Tensor pos;
  std::vector<std::shared_ptr<Block>> blocks;  // also registered as blocks.{i}
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};

SequenceForecaster::SequenceForecaster(const SequenceOptions& o)
    : options_(o), layers_(std::make_shared<Layers>()) {
  require_positive_sequence("data.features (input columns)", o.features);
  require_positive_sequence("data.window", o.window);
  require_positive_sequence("data.horizon", o.horizon);
  require_sequence(
      o.targets > 0,
      fmt::format("data.targets must name at least one target column, got {}", o.targets));
  require_positive_sequence("model.num_layers", o.num_layers);
  require_sequence(o.dropout >= 0.0 && o.dropout < 1.0,
                   fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));

  Layers& l = *layers_;
  int64_t width = 0;  // of the encoder's output, the head's input
  if (o.cell == SequenceCell::kLstm) {
    require_positive_sequence("model.hidden_dim", o.hidden_dim);
    // Dropout acts between layers only, so one layer has none (torch.nn.LSTM warns otherwise).
    l.lstm =
        register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(o.features, o.hidden_dim)
                                                    .num_layers(o.num_layers)
                                                    .batch_first(true)
                                                    .dropout(o.num_layers > 1 ? o.dropout : 0.0)));
    width = o.hidden_dim;
  } else {
    require_positive_sequence("model.d_model", o.d_model);
    require_positive_sequence("model.heads", o.heads);
    require_sequence(
        o.d_model % o.heads == 0,
        fmt::format("model.heads ({}) must divide model.d_model ({})", o.heads, o.d_model));
    const int64_t d = o.d_model;
    l.in_proj = register_module("in_proj", torch::nn::Linear(o.features, d));
    {
      at::NoGradGuard no_grad;
      l.pos = register_parameter("pos", at::empty({o.window, d}).normal_(0.0, kPosInitStd));
    }
    l.blocks = add_blocks(*this, "blocks", o.num_layers, encoder_block(o));
    l.ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(kSequenceNormEps)));
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
  const int64_t len = inputs.size(1);
  if (len == 0 || len > options_.window) {
    throw std::invalid_argument(
        fmt::format("sequence: transformer inputs have {} steps; 1 to data.window = {} are allowed",
                    len, options_.window));
  }
  const bool train = is_training();
  const double p = train ? options_.dropout : 0.0;
  at::Tensor x = linear(l.in_proj, inputs) + l.pos.narrow(0, 0, len);
  x = at::dropout(x, p, train);
  x = run_blocks(l.blocks, x, p, /*checkpointed=*/false);
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
