#include "models/cnn.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>

#include <stdexcept>
#include <vector>

namespace models {
namespace {

// PSNR of a perfect image: 10 log10(1 / kMseFloor) = 100 dB instead of infinity, so one exact
// image does not turn a validation average into inf.
constexpr double kMseFloor = 1e-10;

torch::nn::Conv2d conv3x3(int64_t in, int64_t out) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
}

}  // namespace

struct RestorationCnn::Layers {
  struct ResBlock {
    torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  };
  torch::nn::Conv2d head{nullptr};
  std::vector<ResBlock> blocks;
  torch::nn::Conv2d body_tail{nullptr};
  std::vector<torch::nn::Conv2d> up;  // one Conv(B, 4B) + PixelShuffle(2) per factor 2
  torch::nn::Conv2d tail{nullptr};
};

RestorationCnn::RestorationCnn(const CnnOptions& o)
    : options_(o), layers_(std::make_shared<Layers>()) {
  if (o.scale != 1 && o.scale != 2 && o.scale != 4) {
    throw std::invalid_argument(fmt::format("cnn: data.scale must be 1, 2 or 4, got {}", o.scale));
  }
  if (o.channels <= 0) {
    throw std::invalid_argument(fmt::format(
        "cnn: image channels (from data.dataset) must be positive, got {}", o.channels));
  }
  if (o.base_channels <= 0) {
    throw std::invalid_argument(
        fmt::format("cnn: model.base_channels must be positive, got {}", o.base_channels));
  }
  if (o.num_blocks < 0) {
    throw std::invalid_argument(
        fmt::format("cnn: model.num_blocks must be zero or more, got {}", o.num_blocks));
  }

  Layers& l = *layers_;
  const int64_t b = o.base_channels;
  l.head = register_module("head", conv3x3(o.channels, b));
  auto blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_blocks; ++i) {
    auto block = std::make_shared<torch::nn::Module>();
    Layers::ResBlock r;
    r.conv1 = block->register_module("conv1", conv3x3(b, b));
    r.conv2 = block->register_module("conv2", conv3x3(b, b));
    blocks->push_back(block);
    l.blocks.push_back(std::move(r));
  }
  l.body_tail = register_module("body_tail", conv3x3(b, b));
  if (o.scale > 1) {
    auto up = register_module("up", torch::nn::ModuleList());
    for (int64_t s = o.scale; s > 1; s /= 2) {
      l.up.push_back(conv3x3(b, 4 * b));
      up->push_back(l.up.back());
    }
  }
  l.tail = register_module("tail", conv3x3(b, o.channels));
}

void RestorationCnn::set_channels_last(bool on) {
  format_ = on ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::NoGradGuard no_grad;
  for (auto& p : parameters()) {
    if (p.dim() == 4) p.set_data(p.data().contiguous(format_));
  }
}

at::Tensor RestorationCnn::forward(const at::Tensor& raw_inputs) {
  if (raw_inputs.dim() != 4 || raw_inputs.size(1) != options_.channels) {
    throw std::invalid_argument(fmt::format("cnn: inputs must be [n, {}, h, w], got {}",
                                            options_.channels, raw_inputs.sizes()));
  }
  // Channels-last weights want channels-last activations (no-op when already in that format).
  const at::Tensor inputs = raw_inputs.contiguous(format_);
  Layers& l = *layers_;
  const at::Tensor f = l.head->forward(inputs);
  at::Tensor y = f;
  for (Layers::ResBlock& r : l.blocks) {
    y = y + r.conv2->forward(at::relu(r.conv1->forward(y)));
  }
  y = l.body_tail->forward(y) + f;
  for (auto& conv : l.up) y = at::pixel_shuffle(conv->forward(y), 2);
  const at::Tensor residual = l.tail->forward(y);
  if (options_.scale == 1) return inputs + residual;
  const int64_t s = options_.scale;
  return residual + at::upsample_bilinear2d(inputs, {inputs.size(2) * s, inputs.size(3) * s},
                                            /*align_corners=*/false);
}

namespace {

void check_targets(const at::Tensor& out, const at::Tensor& targets) {
  if (targets.sizes() != out.sizes()) {
    throw std::invalid_argument(
        fmt::format("cnn: targets must be {}, got {}", out.sizes(), targets.sizes()));
  }
}

}  // namespace

at::Tensor RestorationCnn::loss(const at::Tensor& inputs, const at::Tensor& targets) {
  const at::Tensor out = forward(inputs);
  check_targets(out, targets);
  return options_.loss == CnnLoss::kL1 ? at::l1_loss(out, targets) : at::mse_loss(out, targets);
}

std::vector<std::pair<std::string, at::Tensor>> RestorationCnn::eval_sums(
    const at::Tensor& inputs, const at::Tensor& targets) {
  const at::Tensor out = forward(inputs);
  check_targets(out, targets);
  // Per-image means in double: PSNR near a perfect image is the log of a tiny difference.
  const at::Tensor t = targets.to(at::kDouble);
  const at::Tensor diff = out.to(at::kDouble) - t;
  const std::vector<int64_t> image_dims{1, 2, 3};
  const at::Tensor per_image_loss =
      options_.loss == CnnLoss::kL1 ? diff.abs().mean(image_dims) : diff.square().mean(image_dims);
  const at::Tensor mse = (out.to(at::kDouble).clamp(0.0, 1.0) - t).square().mean(image_dims);
  const at::Tensor psnr = mse.clamp_min(kMseFloor).log10().mul(-10.0);  // 10 log10(1 / mse)
  return {{"loss", per_image_loss.sum()}, {"psnr", psnr.sum()}};
}

}  // namespace models
