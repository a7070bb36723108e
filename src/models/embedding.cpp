#include "models/embedding.h"

#include <ATen/ATen.h>

#include "models/deferred_init.h"

namespace models {

Embedding::Embedding(int64_t num, int64_t dim) {
  weight = register_parameter("weight", new_parameter({num, dim}));
  // torch::nn::Embedding's reset_parameters: N(0, 1).
  init_parameter(weight, [](const at::Tensor& w) { w.normal_(0.0, 1.0); });
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

}  // namespace models
