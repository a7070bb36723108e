// Model: what the training loop needs of a network. Models know nothing of ranks or datasets:
// they take input tensors and give a loss (the mean over the batch).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace models {

// The model section of the config (declared with defaults in launcher/config_schema.cpp).
struct ModelOptions {
  std::string name;
  int64_t hidden_dim = 0;  // width of each hidden layer (recommender: of the item tower)
  int64_t depth = 0;       // number of hidden layers (recommender: of the item tower)
  // recommender
  int64_t embedding_dim = 0;    // user and item vectors (and the text encoder's output)
  int64_t encoder_dim = 0;      // text encoder width
  int64_t encoder_layers = 0;   // text encoder blocks
  int64_t encoder_heads = 0;    // text encoder attention heads (divides encoder_dim)
  int64_t text_len = 0;         // text encoder positions; 0: the data's item text length
  std::string encoder_weights;  // safetensors file for the text encoder; empty: seeded random
};

// What the data says the model must accept and produce.
struct ModelShape {
  int64_t input_dim = 0;
  int64_t num_classes = 0;
  // Id-based data (recommender): users, items and each item's text, int64 [num_items, L].
  int64_t num_users = 0;
  int64_t num_items = 0;
  at::Tensor item_text;
};

class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;
  // Mean loss over the batch.
  virtual at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;
  // Embedding caches (the OOM fallback's last rung): build_cache() allocates them, on the model's
  // device, before the first step; uncache() releases them for good (the model then computes
  // what they held on the fly) and returns false when there was nothing left to release.
  // Models without caches keep these no-ops.
  virtual void build_cache() {}
  virtual bool uncache() { return false; }
  // Whether there is a cache that uncache() would release.
  virtual bool has_cache() const { return false; }
  // Names (as in named_buffers()) of the buffers that hold caches: derived state, left out of
  // checkpoints and rebuilt by build_cache().
  virtual std::vector<std::string> cache_buffer_names() const { return {}; }
};

}  // namespace models
