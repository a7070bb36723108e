// RestorationCnn: image restoration (denoising at scale 1, super-resolution at scale 2 or 4), in
// the shape of EDSR without batch norm.
//
//   x [n, C, h, w] (values in [0, 1])
//   -> head Conv3x3(C, B) = f
//   -> num_blocks x ResBlock: y = y + Conv3x3(B, B)(ReLU(Conv3x3(B, B)(y)))
//   -> body_tail Conv3x3(B, B), plus f (a long skip)
//   -> upsampler: scale 1: nothing; 2: Conv3x3(B, 4B) + PixelShuffle(2); 4: that twice
//   -> tail Conv3x3(B, C)
//   -> scale 1: x + tail (the network predicts the residual); 2, 4: tail + bilinear upsample of x
//      (align_corners = false)
// Loss: l1 (mean absolute error) or mse against the clean target [n, C, h*s, w*s].
// eval_sums: {"loss", the sum over images of each image's loss} and {"psnr", the sum over images of
// 10 log10(1 / MSE) with the output clamped to [0, 1] and MSE floored at 1e-10 (a perfect image
// gives 100 dB, not infinity)}, in double.
//
// Initialisation: LibTorch's Conv2d defaults. Parameter names: head.weight/bias,
// blocks.{i}.conv1.weight/bias, blocks.{i}.conv2.weight/bias, body_tail.weight/bias,
// up.{k}.weight/bias (k = 0 or 0, 1), tail.weight/bias. Channels-last memory format is
// supported (the caller may convert the module and inputs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/capabilities.h"
#include "models/model.h"

namespace models {

struct CnnOptions {
  int64_t channels = 0;  // image channels (3: RGB, 1: grey)
  int64_t scale = 1;     // 1, 2 or 4
  int64_t base_channels = 0;
  int64_t num_blocks = 0;
  CnnLoss loss{};  // l1 | mse
};

class RestorationCnn final : public Model, public ChannelsLast {
 public:
  // Throws std::invalid_argument naming the model or data key for inconsistent options.
  explicit RestorationCnn(const CnnOptions& options);
  at::Tensor forward(const at::Tensor& inputs) override;
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;
  std::vector<std::pair<std::string, at::Tensor>> eval_sums(const at::Tensor& inputs,
                                                            const at::Tensor& targets) override;
  const CnnOptions& options() const { return options_; }
  void set_channels_last(bool on) override;

 private:
  // The convolutions, typed (defined in cnn.cpp so this header stays free of the conv headers).
  // They are registered on this module, which owns them.
  struct Layers;

  CnnOptions options_;
  std::shared_ptr<Layers> layers_;
  at::MemoryFormat format_ = at::MemoryFormat::Contiguous;
};

}  // namespace models
