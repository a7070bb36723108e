// SyntheticClassification: a seeded classification task with learnable structure. Inputs are
// standard normal; the label is the argmax of a fixed random teacher network
// (tanh(x W1) W2), with a fraction `label_noise` of labels replaced by random classes. A student
// MLP can fit it, so the loss visibly drops; the same seed gives the same data on every rank.
#pragma once

#include "data/dataset.h"

namespace data {

class SyntheticClassification final : public Dataset {
 public:
  explicit SyntheticClassification(const DataOptions& options);
  int64_t size() const override { return inputs_.size(0); }
  core::Shape shape() const override {
    core::Shape s;
    s.input_dim = inputs_.size(1);
    s.num_classes = num_classes_;
    return s;
  }
  Batch get(const at::Tensor& indices) const override;

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
  int64_t num_classes_;
};

}  // namespace data
