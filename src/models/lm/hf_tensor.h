// One tensor of Hugging Face's files as rows of one of the model's parameters, and a family's
// map of them (models/lm/hf_ranges.h: what reads and writes the files by it). Apart from
// hf_ranges.h so that the language-model base (lm/causal_lm.h), which hf_ranges.cpp includes,
// can name the map too (CausalLm::hf_map, whose file tensors are Muon's matrices).
//
// A file tensor is rows [row_begin, row_begin + rows) of a parameter of shape [R, C...]: the same
// elements in the same order (llama's q_proj, k_proj and v_proj are three row ranges of its fused
// qkv_proj; the embedding's real vocabulary the first rows of the padded one), or, transposed,
// a [C, rows] matrix (GPT-2's Conv1D weights). A `check_only` tensor is a tied copy (a tied
// model's lm_head.weight): loading reads it where it reads the parameter and requires it equal;
// an export leaves it out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace models {

struct HfTensor {
  std::string name;   // in the files
  std::string param;  // the model's parameter
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool transposed = false;
  bool check_only = false;
  // The file's shape, for the parameter's shape `param_shape`.
  std::vector<int64_t> file_shape(const std::vector<int64_t>& param_shape) const {
    std::vector<int64_t> shape = param_shape;
    if (shape.empty()) return shape;
    shape[0] = rows;
    if (transposed && shape.size() == 2) std::swap(shape[0], shape[1]);
    return shape;
  }
};
using HfMap = std::vector<HfTensor>;
using ParameterShapes = std::map<std::string, std::vector<int64_t>>;

}  // namespace models
