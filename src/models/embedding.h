// Embedding: a lookup table of `num` rows of `dim` (gpt's wte and wpe, llama's embed_tokens), as
// torch::nn::Embedding computes and initialises it (N(0, 1), draw for draw; forward
// at::embedding), with its weight made through models::new_parameter, so that a model of it can
// be built without storage (models/deferred_init.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace models {

class Embedding final : public torch::nn::Module {
 public:
  Embedding(int64_t num, int64_t dim);
  // [..., dim] for ids int64 [...] below num.
  at::Tensor forward(const at::Tensor& ids) const;

  at::Tensor weight;  // [num, dim]
};

}  // namespace models
