// The restoration CNN: loss and every gradient against the PyTorch reference
// tests/reference/cnn.py on the same weights (scale 1, 2, 4), output shapes, parameter names,
// PSNR in closed form, channels-last inputs, and the option checks.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cnn.h"
#include "reference_harness.h"

namespace TRAINER_UNITY_ID {

using models::CnnOptions;
using models::RestorationCnn;
using ::testing::HasSubstr;

CnnOptions small(int64_t scale, models::CnnLoss loss) {
  return {.channels = 3, .scale = scale, .base_channels = 8, .num_blocks = 2, .loss = loss};
}

std::map<std::string, std::string> meta(const CnnOptions& o) {
  return {{"channels", std::to_string(o.channels)},
          {"scale", std::to_string(o.scale)},
          {"base_channels", std::to_string(o.base_channels)},
          {"num_blocks", std::to_string(o.num_blocks)},
          {"loss", models::kCnnLossNames.at(static_cast<size_t>(o.loss))}};
}

// A batch of n non-square images for `o`: inputs [n, C, h, w] and targets at `scale` times.
std::pair<at::Tensor, at::Tensor> batch(const CnnOptions& o, int64_t n, int64_t h, int64_t w) {
  return {at::rand({n, o.channels, h, w}), at::rand({n, o.channels, h * o.scale, w * o.scale})};
}

void expect_reference(const CnnOptions& o, int64_t h, int64_t w) {
  at::manual_seed(10 + o.scale);
  RestorationCnn model(o);
  const auto [inputs, targets] = batch(o, 2, h, w);
  test::expect_matches_reference(model, inputs, targets, "cnn.py", meta(o), 1e-4);
}

// Every parameter zero but the tail's bias: the network's residual is that constant everywhere.
void set_constant_residual(RestorationCnn& model, double value) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.zero_();
  model.named_parameters()["tail.bias"].fill_(value);
}

double eval_sum(RestorationCnn& model, const at::Tensor& inputs, const at::Tensor& targets,
                const std::string& name) {
  at::NoGradGuard no_grad;
  for (const auto& [key, value] : model.eval_sums(inputs, targets)) {
    if (key != name) continue;
    EXPECT_EQ(value.dim(), 0);
    EXPECT_EQ(value.scalar_type(), at::kDouble);
    return value.item<double>();
  }
  ADD_FAILURE() << "eval_sums gave no '" << name << "'";
  return 0.0;
}

std::string construction_error(const CnnOptions& o) {
  try {
    RestorationCnn model(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CnnReference, Scale1L1MatchesPyTorch) {
  expect_reference(small(1, models::CnnLoss::kL1), 6, 5);
}
TEST(CnnReference, Scale2MseMatchesPyTorch) {
  expect_reference(small(2, models::CnnLoss::kMse), 5, 4);
}
TEST(CnnReference, Scale4L1MatchesPyTorch) {
  expect_reference(small(4, models::CnnLoss::kL1), 3, 4);
}

TEST(CnnShape, OutputIsInputTimesScale) {
  for (int64_t scale : {1, 2, 4}) {
    RestorationCnn model(small(scale, models::CnnLoss::kMse));
    EXPECT_EQ(model.forward(at::rand({2, 3, 5, 7})).sizes(),
              (std::vector<int64_t>{2, 3, 5 * scale, 7 * scale}))
        << "scale " << scale;
  }
  RestorationCnn model(small(2, models::CnnLoss::kL1));
  EXPECT_THROW(model.forward(at::rand({2, 1, 5, 7})), std::invalid_argument);  // channels
  EXPECT_THROW(model.loss(at::rand({2, 3, 5, 7}), at::rand({2, 3, 5, 7})), std::invalid_argument);
}

TEST(CnnNames, ParametersAreNamedAsTheHeader) {
  RestorationCnn model(small(4, models::CnnLoss::kL1));
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected;
  for (const std::string layer : {"head", "blocks.0.conv1", "blocks.0.conv2", "blocks.1.conv1",
                                  "blocks.1.conv2", "body_tail", "up.0", "up.1", "tail"}) {
    expected.push_back(layer + ".weight");
    expected.push_back(layer + ".bias");
  }
  EXPECT_EQ(names, expected);
  const auto params = model.named_parameters();
  EXPECT_EQ(params["head.weight"].sizes(), (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(params["up.1.weight"].sizes(), (std::vector<int64_t>{32, 8, 3, 3}));
  EXPECT_EQ(params["tail.weight"].sizes(), (std::vector<int64_t>{3, 8, 3, 3}));
  // Scale 1 has no upsampler.
  RestorationCnn denoiser(small(1, models::CnnLoss::kL1));
  EXPECT_FALSE(denoiser.named_parameters().contains("up.0.weight"));
}

TEST(CnnGlobalSkip, ZeroNetworkGivesTheInputOrItsBilinearUpsample) {
  const at::Tensor x = at::rand({2, 3, 4, 5});
  RestorationCnn denoiser(small(1, models::CnnLoss::kL1));
  set_constant_residual(denoiser, 0.0);
  EXPECT_TRUE(at::equal(denoiser.forward(x), x));
  RestorationCnn upscaler(small(2, models::CnnLoss::kL1));
  set_constant_residual(upscaler, 0.0);
  EXPECT_TRUE(at::allclose(upscaler.forward(x),
                           at::upsample_bilinear2d(x, {8, 10}, /*align_corners=*/false)));
}

TEST(CnnEval, PsnrOfAConstantOffsetOfPointOneIs20dB) {
  for (const auto loss : {models::CnnLoss::kL1, models::CnnLoss::kMse}) {
    RestorationCnn model(small(1, loss));
    model.eval();
    set_constant_residual(model, 0.1);                        // output = input + 0.1
    const at::Tensor targets = at::rand({3, 3, 6, 5}) * 0.8;  // output stays inside [0, 1]
    EXPECT_NEAR(eval_sum(model, targets, targets, "psnr"), 3 * 20.0, 1e-4)
        << static_cast<int>(loss);
    EXPECT_NEAR(eval_sum(model, targets, targets, "loss"),
                3 * (loss == models::CnnLoss::kL1 ? 0.1 : 0.01), 1e-6)
        << static_cast<int>(loss);
  }
}

TEST(CnnEval, PsnrClampsTheOutputAndFloorsTheError) {
  RestorationCnn model(small(1, models::CnnLoss::kMse));
  model.eval();
  const at::Tensor x = at::rand({2, 3, 4, 4});
  set_constant_residual(model, 0.0);  // a perfect image: 10 log10(1 / 1e-10)
  EXPECT_NEAR(eval_sum(model, x, x, "psnr"), 2 * 100.0, 1e-9);
  // Output 1.5 against 1 is clamped to a perfect 1; the loss sees the unclamped output.
  set_constant_residual(model, 0.5);
  const at::Tensor ones = at::ones({2, 3, 4, 4});
  EXPECT_NEAR(eval_sum(model, ones, ones, "psnr"), 2 * 100.0, 1e-9);
  EXPECT_NEAR(eval_sum(model, ones, ones, "loss"), 2 * 0.25, 1e-9);
}

TEST(CnnEval, LossSumIsTheMeanLossTimesTheBatch) {
  at::manual_seed(5);
  for (int64_t scale : {1, 2}) {
    RestorationCnn model(small(scale, models::CnnLoss::kL1));
    const auto [inputs, targets] = batch(model.options(), 4, 5, 6);
    const double mean = model.loss(inputs, targets).item<double>();
    EXPECT_NEAR(eval_sum(model, inputs, targets, "loss"), 4 * mean, 1e-5);
  }
}

TEST(CnnChannelsLast, MatchesContiguousOutputAndGradients) {
  for (int64_t scale : {1, 2, 4}) {
    at::manual_seed(20 + scale);
    RestorationCnn model(small(scale, models::CnnLoss::kMse));
    const auto [inputs, targets] = batch(model.options(), 2, 5, 6);
    const at::Tensor out = model.forward(inputs).detach();
    model.zero_grad();
    model.loss(inputs, targets).backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());

    for (auto& p : model.parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
    ASSERT_TRUE(
        model.named_parameters()["head.weight"].is_contiguous(at::MemoryFormat::ChannelsLast));
    const at::Tensor cl_inputs = inputs.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor cl_targets = targets.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor cl_out = model.forward(cl_inputs).detach();
    EXPECT_EQ(cl_out.sizes(), out.sizes());
    EXPECT_TRUE(at::allclose(cl_out, out, 1e-5, 1e-6))
        << "scale " << scale << ": max difference " << (cl_out - out).abs().max().item<double>();
    model.zero_grad();
    model.loss(cl_inputs, cl_targets).backward();
    const auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(at::allclose(params[i].grad(), grads[i], 1e-4, 1e-6))
          << "scale " << scale << ", parameter " << i;
    }
  }
}

TEST(CnnValidation, ErrorsNameTheConfigKey) {
  CnnOptions o = small(3, models::CnnLoss::kL1);
  EXPECT_THAT(construction_error(o), HasSubstr("data.scale must be 1, 2 or 4"));
  o = small(1, models::CnnLoss::kL1);
  o.base_channels = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("model.base_channels"));
  o = small(1, models::CnnLoss::kL1);
  o.channels = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("channels"));
  o = small(1, models::CnnLoss::kL1);
  o.num_blocks = -1;
  EXPECT_THAT(construction_error(o), HasSubstr("model.num_blocks"));
  o = small(4, models::CnnLoss::kMse);
  o.num_blocks = 0;  // no residual blocks is a valid (small) network
  EXPECT_EQ(construction_error(o), "");
}

}  // namespace TRAINER_UNITY_ID
