#include "models/attention_mask.h"

#include <ATen/ATen.h>

namespace models {

bool needs_causal_mask(int64_t queries, int64_t past, int64_t window) {
  return (past > 0 && queries > 1) || (window > 0 && past + queries > window);
}

at::Tensor causal_mask(int64_t queries, int64_t past, int64_t window,
                       const at::TensorOptions& options) {
  const at::Tensor ones = at::ones({queries, past + queries}, options.dtype(at::kBool));
  // tril(past): key j <= past + i; triu(past - window + 1): key j >= past + i - window + 1.
  at::Tensor mask = ones.tril(past);
  if (window > 0) mask = mask.logical_and(ones.triu(past - window + 1));
  return mask;
}

at::Tensor document_mask(const at::Tensor& positions, int64_t window) {
  const int64_t t = positions.size(1);
  const at::Tensor index = at::arange(t, positions.options());
  const at::Tensor query = index.view({1, t, 1}), key = index.view({1, 1, t});
  const at::Tensor first = query - positions.unsqueeze(-1);  // [n, T, 1]: i - positions[i]
  at::Tensor mask = key.le(query).logical_and(key.ge(first));
  if (window > 0) mask = mask.logical_and(key.gt(query - window));
  return mask.unsqueeze(1);
}

}  // namespace models
