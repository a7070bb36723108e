// Mlp: a multilayer perceptron classifier: depth x (Linear -> GELU), then a Linear head,
// trained with cross-entropy.
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "models/model.h"

namespace models {

class Mlp final : public Model {
 public:
  Mlp(int64_t input_dim, int64_t hidden_dim, int64_t depth, int64_t num_classes);
  at::Tensor forward(const at::Tensor& inputs) override;
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;

 private:
  torch::nn::ModuleList hidden_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace models
