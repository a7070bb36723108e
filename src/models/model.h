// Model: what the training loop needs of a network. Models know nothing of ranks or datasets:
// they take input tensors and give a loss (the mean over the batch).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace models {

// The model section of the config (declared with defaults in launcher/config_schema.cpp).
struct ModelOptions {
  std::string name;
  int64_t hidden_dim = 0;
  int64_t depth = 0;
};

// What the data says the model must accept and produce.
struct ModelShape {
  int64_t input_dim = 0;
  int64_t num_classes = 0;
};

class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;
  // Mean loss over the batch.
  virtual at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;
};

}  // namespace models
