// A three-layer network whose parameters unit tests hand to the Reducer: 8*16+16 + 16*16+16 +
// 16*4+4 = 484 parameters in six tensors.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "ddp/reducer.h"

namespace trainer_test {

struct Net {
  torch::nn::Linear l1{8, 16}, l2{16, 16}, l3{16, 4};
  ddp::NamedParameters named() {
    ddp::NamedParameters out;
    int i = 0;
    for (auto* l : {&l1, &l2, &l3}) {
      out.emplace_back("l" + std::to_string(++i) + ".weight", (*l)->weight);
      out.emplace_back("l" + std::to_string(i) + ".bias", (*l)->bias);
    }
    return out;
  }
  at::Tensor loss(const at::Tensor& x) { return l3(at::relu(l2(at::relu(l1(x))))).pow(2).mean(); }
  // Copies of the parameters' values.
  std::vector<at::Tensor> values() {
    std::vector<at::Tensor> out;
    for (auto& [name, p] : named()) out.push_back(p.detach().clone());
    return out;
  }
};

}  // namespace trainer_test
