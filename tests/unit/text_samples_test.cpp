// train.sample_every's sampler (train/text_samples.h): it samples from its prompt with the
// configured temperature, top-k and seed (train.sample_temperature, train.sample_top_k,
// train.seed), reaching the model through the Model interface; a model that does not generate
// text and a prompt that fills the context are errors naming their keys.
#include "train/text_samples.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "models/gpt/gpt.h"
#include "models/lm/generate.h"
#include "models/mlp.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

// A data set the sampler must not need: every test gives it a prompt.
class NoData final : public data::Dataset {
 public:
  int64_t size() const override { return 0; }
  core::Shape shape() const override { return {}; }
  data::Batch get(const at::Tensor&) const override {
    throw std::logic_error("the sampler read the data set although it has a prompt");
  }
};

std::shared_ptr<models::Gpt> byte_gpt(int64_t context) {
  models::GptOptions o;
  o.vocab_size = 256;
  o.context = context;
  o.num_layers = 2;
  o.heads = 4;
  o.d_model = 32;
  at::manual_seed(7);
  return std::make_shared<models::Gpt>(o);
}

train::TrainOptions sampling(double temperature, int64_t top_k) {
  train::TrainOptions o;
  o.sample_prompt = "The ";
  o.sample_tokens = 24;
  o.sample_temperature = temperature;
  o.sample_top_k = top_k;
  o.seed = 42;
  return o;
}

// What the sampler must log: the prompt, " | ", then generate()'s ids with `options`.
std::string expected(models::Gpt& gpt, const data::Tokenizer& tokenizer,
                     const train::TrainOptions& options) {
  const std::vector<int64_t> prompt = tokenizer.encode(options.sample_prompt);
  models::SamplingOptions s;
  s.max_new_tokens = options.sample_tokens;
  s.temperature = options.sample_temperature;
  s.top_k = options.sample_top_k;
  s.seed = options.seed;
  return train::one_line(tokenizer.decode(prompt) + " | " +
                         tokenizer.decode(models::generate(gpt, prompt, s)));
}

TEST(TextSamples, SampleWithTheConfiguredTemperatureTopKAndSeed) {
  const auto gpt = byte_gpt(64);
  const std::shared_ptr<const data::Tokenizer> bytes = data::make_tokenizer("bytes");
  const NoData none;
  for (const auto& [temperature, top_k] :
       std::vector<std::pair<double, int64_t>>{{0.8, 200}, {0.0, 200}, {1.5, 7}, {1.0, 0}}) {
    const auto options = sampling(temperature, top_k);
    const auto sample = train::make_text_sampler(gpt, "gpt", bytes, options, none);
    const std::string want = expected(*gpt, *bytes, options);
    EXPECT_EQ(sample(), want) << "temperature " << temperature << ", top-k " << top_k;
    EXPECT_EQ(sample(), want) << "a second sample differs: the seed is not fixed";
  }
}

TEST(TextSamples, TemperatureZeroAndTopKOneAreGreedy) {
  const auto gpt = byte_gpt(64);
  const std::shared_ptr<const data::Tokenizer> bytes = data::make_tokenizer("bytes");
  const NoData none;
  const std::string greedy = train::make_text_sampler(gpt, "gpt", bytes, sampling(0, 0), none)();
  EXPECT_EQ(train::make_text_sampler(gpt, "gpt", bytes, sampling(3.0, 1), none)(), greedy);
  // A random model's next-token distribution is nearly flat: sampling at 0.8 among 200 tokens
  // does not reproduce 24 greedy tokens.
  EXPECT_NE(train::make_text_sampler(gpt, "gpt", bytes, sampling(0.8, 200), none)(), greedy);
}

TEST(TextSamples, ErrorsNameTheirKeys) {
  const std::shared_ptr<const data::Tokenizer> bytes = data::make_tokenizer("bytes");
  const NoData none;
  const auto mlp = std::make_shared<models::Mlp>(8, 16, 1, 4);
  try {
    train::make_text_sampler(mlp, "mlp", bytes, sampling(0.8, 200), none);
    FAIL() << "no error for a model that does not generate text";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.sample_every: samples need a language model "
                                    "(model.name: gpt or llama), not mlp"));
  }
  auto options = sampling(0.8, 200);
  options.sample_prompt = std::string(16, 'x');
  try {
    train::make_text_sampler(byte_gpt(16), "gpt", bytes, options, none);
    FAIL() << "no error for a prompt that fills the context";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.sample_prompt: 16 tokens fill model.context = 16"));
  }
}

TEST(TextSamples, OneLineEscapesControlCharacters) {
  EXPECT_EQ(train::one_line("a\nb\\c\td\x7f"), "a\\nb\\\\c\\x09d\\x7f");
}

}  // namespace TRAINER_UNITY_ID
