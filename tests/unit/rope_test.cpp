// Rotary frequencies (models/rope.h): against the closed form in double precision, Llama 3.1's
// scaling band by band (Meta's apply_scaling), and the option checks.
#include "models/rope.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

TEST(Rope, FrequenciesAreThetaPowers) {
  models::RopeOptions o;
  o.theta = 500.0;
  const at::Tensor f = models::rope_frequencies(12, o);
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{6}));
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(f[i].item<double>(), std::pow(500.0, -2.0 * i / 12.0), 1e-6) << i;
  }
}

// Each frequency falls in one of Meta's three bands; the expected values are spelled here.
TEST(Rope, Llama3ScalingKeepsShortSlowsLongAndBlendsBetween) {
  models::RopeOptions o;
  o.theta = 500.0;
  o.scaling = "llama3";
  o.factor = 8.0;
  o.low_freq_factor = 1.0;
  o.high_freq_factor = 4.0;
  o.original_context = 16;  // wavelengths below 4 kept, above 16 slowed, between blended
  o.theta = 100.0;          // wavelengths 2 pi 100^(2i/8): 6.28, 19.9, 62.8, 199
  const at::Tensor f = models::rope_frequencies(8, o);
  const auto plain = [](int64_t i) { return std::pow(100.0, -2.0 * i / 8.0); };
  // i = 0: wavelength 6.28 is between 4 and 16: s = (16 / 6.28 - 1) / 3.
  const double w0 = 2 * std::numbers::pi / plain(0), s = (16.0 / w0 - 1.0) / 3.0;
  EXPECT_NEAR(f[0].item<double>(), s * plain(0) + (1 - s) * plain(0) / 8.0, 1e-6);
  for (int64_t i = 1; i < 4; ++i) EXPECT_NEAR(f[i].item<double>(), plain(i) / 8.0, 1e-7) << i;
  o.original_context = 4;  // wavelengths above 4 / low_freq_factor = 4 are slowed ...
  o.theta = 1.5;           // ... and these are 6.28 .. 8.5: all of them
  const at::Tensor g = models::rope_frequencies(8, o);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(g[i].item<double>(), std::pow(1.5, -2.0 * i / 8.0) / 8.0, 1e-7) << i;
  }
  o.original_context = 1000;  // all below 1000 / high_freq_factor = 250: kept
  const at::Tensor h = models::rope_frequencies(8, o);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(h[i].item<double>(), std::pow(1.5, -2.0 * i / 8.0), 1e-7) << i;
  }
}

// Gemma 3 4B's global layers: every frequency over the factor, the band edges ignored.
TEST(Rope, LinearScalingSlowsEveryFrequencyAlike) {
  models::RopeOptions o;
  o.theta = 1e6;
  o.scaling = "linear";
  o.factor = 8.0;
  const at::Tensor f = models::rope_frequencies(16, o);
  const at::Tensor plain = models::rope_frequencies(16, {.theta = 1e6});
  EXPECT_TRUE(at::allclose(f * 8.0, plain, 1e-6, 0.0));
  o.factor = 0.5;
  EXPECT_THAT([&] { models::check_rope_options(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("model.rope_factor")));
}

TEST(Rope, BadOptionsNameTheKey) {
  models::RopeOptions o;
  o.theta = 0.5;
  EXPECT_THAT([&] { models::check_rope_options(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("model.rope_theta")));
  o = {};
  o.scaling = "yarn";
  EXPECT_THAT(
      [&] { models::check_rope_options(o); },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("unknown rope scaling 'yarn'")));
  o = {};
  o.scaling = "llama3";
  o.high_freq_factor = 0.5;
  EXPECT_THAT(
      [&] { models::check_rope_options(o); },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("model.rope_high_freq_factor")));
  EXPECT_THROW(models::rope_frequencies(7, {}), std::invalid_argument);
}

}  // namespace TRAINER_UNITY_ID
