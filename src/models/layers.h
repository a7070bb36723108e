// Building blocks the models share, in the fewest passes over memory ATen offers.
//
// - linear(): at::linear with the layer's weight and bias. torch::nn::Linear::forward (the C++
//   frontend's F::linear) computes a matmul and then adds the bias in a second pass for inputs
//   of more than two dimensions; at::linear folds the leading dimensions and adds the bias inside
//   the GEMM (addmm), as Python's nn.Linear does.
// - gelu(): GELU, exact (erf) or tanh-approximated. On contiguous float32 CPU tensors that need a
//   gradient it is one fused pass that computes the output and its derivative together, keeping
//   the derivative for backward in place of the input (the same memory as at::gelu keeps), so
//   backward is one multiply instead of a second evaluation of tanh or erf and exp. Elsewhere
//   (CUDA, 16-bit types, strided views) it is at::gelu. As accurate as at::gelu in float, in value
//   and slope, against double precision (tests/unit/layers_test.cpp). Not twice differentiable.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/linear.h>
#include <torch/nn/modules/linear.h>

namespace models {

inline at::Tensor linear(const torch::nn::LinearImpl& layer, const at::Tensor& x) {
  return at::linear(x, layer.weight, layer.bias);
}
inline at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return linear(*layer, x);
}

enum class GeluApprox { kNone, kTanh };  // at::gelu's approximate = "none" | "tanh"

at::Tensor gelu(const at::Tensor& x, GeluApprox approx);

}  // namespace models
