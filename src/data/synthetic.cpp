#include "data/synthetic.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace data {

SyntheticClassification::SyntheticClassification(const DataOptions& o)
    : num_classes_(o.num_classes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  inputs_ = at::normal(0.0, 1.0, {o.num_samples, o.input_dim}, gen, f32);
  const auto w1 = at::normal(0.0, 1.0 / std::sqrt(double(o.input_dim)),
                             {o.input_dim, o.teacher_hidden}, gen, f32);
  const auto w2 = at::normal(0.0, 1.0 / std::sqrt(double(o.teacher_hidden)),
                             {o.teacher_hidden, o.num_classes}, gen, f32);
  targets_ = at::tanh(inputs_.matmul(w1)).matmul(w2).argmax(1);
  if (o.label_noise > 0) {
    const auto flip = at::rand({o.num_samples}, gen, f32) < o.label_noise;
    const auto random =
        at::randint(o.num_classes, {o.num_samples}, gen, at::TensorOptions().dtype(at::kLong));
    targets_ = at::where(flip, random, targets_);
  }
}

Batch SyntheticClassification::get(const at::Tensor& indices) const {
  return {inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

}  // namespace data
