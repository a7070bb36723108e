#include "models/text_encoder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

#include "io/safetensors.h"
#include "models/block.h"

namespace models {

using io::read_safetensors;
using io::SafetensorsError;

namespace {

constexpr double kEncoderNormEps = 1e-5;  // GPT-2's
constexpr double kEncoderInitStd = 0.02;  // GPT-2's

void check_positive(const char* what, int64_t value) {
  if (value <= 0) {
    throw std::invalid_argument(
        fmt::format("text encoder: {} must be positive, got {}", what, value));
  }
}

// GPT-2's block as stored in GPT-2's files: frozen, weights [in, out] applied as x @ w + b, and
// at::gelu (the encoder predates the fused GELU; its features stay what they were).
BlockOptions frozen_block(const TextEncoderOptions& o) {
  BlockOptions b;
  b.d_model = o.dim;
  b.heads = o.heads;
  b.norm_eps = kEncoderNormEps;
  b.fused_gelu = false;
  b.causal = false;  // the forward's mask is causal and masks padding
  b.layout = WeightLayout::kInOut;
  b.frozen = true;
  return b;
}

// x @ w + b with w stored [in, out] (GPT-2's Conv1D layout).
at::Tensor affine(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::matmul(x, w) + b;
}

}  // namespace

TextEncoder::TextEncoder(const TextEncoderOptions& o) : options_(o) {
  check_positive("dim", o.dim);
  check_positive("layers", o.layers);
  check_positive("heads", o.heads);
  check_positive("max_len", o.max_len);
  check_positive("out_dim", o.out_dim);
  if (o.dim % o.heads != 0) {
    throw std::invalid_argument(
        fmt::format("text encoder: heads ({}) must divide dim ({})", o.heads, o.dim));
  }

  // One CPU generator drawn in a fixed order: the same seed gives the same weights everywhere.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto normal = [&](std::vector<int64_t> shape, double std) {
    return at::normal(0.0, std, shape, gen, f32);
  };
  const int64_t d = o.dim;
  const double residual_std = kEncoderInitStd / std::sqrt(2.0 * double(o.layers));
  wte_ = add("wte.weight", normal({kVocab, d}, kEncoderInitStd));
  wpe_ = add("wpe.weight", normal({o.max_len, d}, kEncoderInitStd));
  blocks_ = add_blocks(*this, "h", o.layers, frozen_block(o), [&](Block& b) {
    // Drawn per block in GPT-2's order; norms 1 and 0, biases 0 as the block built them.
    b.qkv().weight.normal_(0.0, kEncoderInitStd, gen);
    b.attn_out().weight.normal_(0.0, residual_std, gen);
    b.up().weight.normal_(0.0, kEncoderInitStd, gen);
    b.mlp_out().weight.normal_(0.0, residual_std, gen);
  });
  ln_f_w_ = add("ln_f.weight", at::ones({d}, f32));
  ln_f_b_ = add("ln_f.bias", at::zeros({d}, f32));
  // The final LayerNorm gives unit-variance features; 1/sqrt(dim) keeps them near unit scale.
  proj_w_ = add("proj.weight", normal({d, o.out_dim}, 1.0 / std::sqrt(double(d))));
  proj_b_ = add("proj.bias", at::zeros({o.out_dim}, f32));
}

at::Tensor TextEncoder::add(const std::string& name, at::Tensor value) {
  torch::nn::Module* parent = this;
  std::string prefix;
  size_t start = 0;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
    const std::string part = name.substr(start, dot - start);
    prefix += part + ".";
    auto& holder = holders_[prefix];
    if (!holder) holder = parent->register_module(part, std::make_shared<torch::nn::Module>());
    parent = holder.get();
    start = dot + 1;
  }
  return parent->register_buffer(name.substr(start), std::move(value));
}

at::Tensor TextEncoder::forward(const at::Tensor& tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong) {
    throw std::invalid_argument(fmt::format("text encoder: tokens must be int64 [n, L], got {} {}",
                                            c10::toString(tokens.scalar_type()), tokens.sizes()));
  }
  const int64_t n = tokens.size(0);
  const int64_t len = tokens.size(1);
  if (len > options_.max_len) {
    throw std::invalid_argument(
        fmt::format("text encoder: texts of {} tokens exceed max_len {}", len, options_.max_len));
  }
  if (n == 0 || len == 0) return proj_b_.expand({n, options_.out_dim}).clone();

  const int64_t d = options_.dim;
  const auto on = tokens.options();
  at::Tensor x = at::embedding(wte_, tokens) + at::embedding(wpe_, at::arange(len, on));

  // mask[b, q, k]: query q attends key k when k <= q (causal) and k is text; every query also
  // attends itself, so a padding query never has an empty row (its output is ignored below).
  const at::Tensor real = tokens.ne(kPadId);
  const auto bools = on.dtype(at::kBool);
  const at::Tensor mask =
      ((at::ones({len, len}, bools).tril() & real.unsqueeze(1)) | at::eye(len, bools))
          .unsqueeze(1);  // [n, 1, L, L], broadcast over heads

  x = run_blocks(blocks_, x, 0.0, /*checkpointed=*/false, &mask);
  x = at::layer_norm(x, {d}, ln_f_w_, ln_f_b_, kEncoderNormEps);

  const at::Tensor w = real.unsqueeze(-1).to(x.scalar_type());  // [n, L, 1]
  const at::Tensor pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0);
  return affine(pooled, proj_w_, proj_b_);
}

std::map<std::string, at::Tensor> TextEncoder::weights() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : named_buffers()) out.emplace(item.key(), item.value());
  return out;
}

void TextEncoder::load_safetensors(const std::string& path) {
  const auto file = read_safetensors(path);
  const auto mine = weights();
  const std::string config =
      fmt::format("dim {}, layers {}, heads {}, max_len {}, out_dim {}", options_.dim,
                  options_.layers, options_.heads, options_.max_len, options_.out_dim);
  // Check everything before changing anything.
  for (const auto& [name, weight] : mine) {
    auto it = file.find(name);
    if (it == file.end()) {
      throw SafetensorsError(
          fmt::format("{}: missing tensor '{}' (text encoder with {})", path, name, config));
    }
    if (it->second.sizes() != weight.sizes()) {
      throw SafetensorsError(
          fmt::format("{}: tensor '{}' has shape {} but the text encoder ({}) needs {}", path, name,
                      it->second.sizes(), config, weight.sizes()));
    }
    if (!at::isFloatingType(it->second.scalar_type())) {
      throw SafetensorsError(fmt::format("{}: tensor '{}' has dtype {}; a floating dtype is needed",
                                         path, name, c10::toString(it->second.scalar_type())));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : file) {
    if (!mine.count(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    throw SafetensorsError(fmt::format("{}: tensors the text encoder ({}) does not have: {}", path,
                                       config, fmt::join(unexpected, ", ")));
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, weight] : mine) {
    at::Tensor target = weight;  // shares the buffer's storage
    target.copy_(file.at(name));
  }
}

}  // namespace models
