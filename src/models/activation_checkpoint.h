// Activation checkpointing for one segment of a model (a transformer block): forward keeps only
// the segment's input; backward recomputes the segment under the random and autocast state of the
// first run, so the result, the gradients and the dropout masks are those of an ordinary run
// (Note [Checkpointed blocks] in activation_checkpoint.cpp). The memory.fallback rung
// checkpoint_activations turns it on through Model::set_checkpoint_activations.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace models {

// x -> f(x), recomputed in backward instead of keeping f's activations. Call it only while a
// graph is recorded (grad mode on); f must be a pure function of x and of module parameters.
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> f, const at::Tensor& x);

}  // namespace models
