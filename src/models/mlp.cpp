#include "models/mlp.h"

#include "models/layers.h"

#include <ATen/ATen.h>

namespace models {

Mlp::Mlp(int64_t input_dim, int64_t hidden_dim, int64_t depth, int64_t num_classes) {
  hidden_ = register_module("hidden", torch::nn::ModuleList());
  int64_t width = input_dim;
  for (int64_t i = 0; i < depth; ++i) {
    hidden_->push_back(torch::nn::Linear(width, hidden_dim));
    width = hidden_dim;
  }
  head_ = register_module("head", torch::nn::Linear(width, num_classes));
}

at::Tensor Mlp::forward(const at::Tensor& inputs) {
  at::Tensor x = inputs;
  for (const auto& layer : *hidden_) {
    x = gelu(linear(*layer->as<torch::nn::Linear>(), x), GeluApprox::kNone);
  }
  return linear(head_, x);
}

at::Tensor Mlp::loss(const at::Tensor& inputs, const at::Tensor& targets) {
  return at::cross_entropy_loss(forward(inputs), targets);
}

}  // namespace models
