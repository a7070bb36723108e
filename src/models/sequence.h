// SequenceForecaster: predicts the next `horizon` steps of `targets` columns from a window of
// `window` steps of `features` columns. Loss: mean squared error over every predicted value.
//
// cell = lstm:
//   x [n, W, F] -> LSTM(F, hidden_dim, num_layers, batch_first, dropout between layers)
//   -> the last step's output h [n, hidden_dim] -> head Linear(hidden_dim, horizon * targets)
// cell = transformer (pre-LayerNorm encoder, no causal mask: the whole window is the input):
//   x -> in_proj Linear(F, d_model) + pos (learned [W, d_model]) -> dropout
//   -> num_layers x Block (models/block.h): x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
//        attn: Linear(d, 3d) -> heads -> scaled_dot_product_attention -> Linear(d, d)
//        mlp:  Linear(d, 4d) -> GELU (exact, erf) -> Linear(4d, d)
//   -> ln_f -> the last position [n, d_model] -> head Linear(d_model, horizon * targets)
// Output reshaped to [n, horizon, targets].
//
// Dropout (model.dropout, training mode only): lstm: between LSTM layers; transformer: after the
// position embedding, on the attention probabilities, and on each residual branch's output.
// LayerNorm eps 1e-5; attention scale 1/sqrt(d_model / heads).
//
// Initialisation: LibTorch's defaults for LSTM and Linear; pos N(0, 0.02); LayerNorm 1 and 0.
// Parameter names: lstm.weight_ih_l{k}, lstm.weight_hh_l{k}, lstm.bias_ih_l{k}, lstm.bias_hh_l{k}
// (as torch.nn.LSTM), head.weight, head.bias; transformer: in_proj.weight/bias, pos,
// blocks.{i}.ln_1.weight/bias, blocks.{i}.attn.qkv.weight/bias, blocks.{i}.attn.proj.weight/bias,
// blocks.{i}.ln_2.weight/bias, blocks.{i}.mlp.fc.weight/bias, blocks.{i}.mlp.proj.weight/bias,
// ln_f.weight/bias, head.weight/bias.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/model.h"

namespace models {

struct SequenceOptions {
  SequenceCell cell{};  // lstm | transformer
  int64_t features = 0;
  int64_t window = 0;
  int64_t horizon = 0;
  int64_t targets = 0;
  int64_t hidden_dim = 0;  // lstm
  int64_t num_layers = 0;
  int64_t d_model = 0;     // transformer
  int64_t heads = 0;       // transformer
  double dropout = 0.0;
};

class SequenceForecaster final : public Model {
 public:
  // Throws std::invalid_argument naming the model key for inconsistent options.
  explicit SequenceForecaster(const SequenceOptions& options);
  // [n, horizon, targets] for inputs float [n, T, features]; T may be any length for lstm and at
  // most `window` for transformer (positions 0..T-1).
  at::Tensor forward(const at::Tensor& inputs) override;
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;
  const SequenceOptions& options() const { return options_; }

 private:
  // The submodules, typed (defined in sequence.cpp so this header stays free of the LSTM and
  // LayerNorm headers). They are registered on this module, which owns them.
  struct Layers;

  at::Tensor encode_lstm(const at::Tensor& inputs);
  at::Tensor encode_transformer(const at::Tensor& inputs);

  SequenceOptions options_;
  std::shared_ptr<Layers> layers_;
};

}  // namespace models
