// Hugging Face GPT-2 weights in and out (models/gpt/hf_gpt2.h) and generation with a KV cache
// (models/lm/generate.h), against `transformers` itself (tests/hf/hf_gpt2.py, offline, random
// models): a GPT2LMHeadModel saved with save_pretrained loads through model.init_from with the
// same logits; greedy generation equals transformers' generate(do_sample=False) token for token;
// a model written by export_hf_gpt2 loads with from_pretrained with the same logits; KV-cache
// decoding equals recomputing the whole sequence; and the errors of model.init_from name the
// file and both shapes.
#include "models/gpt/hf_gpt2.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "models/gpt/gpt.h"
#include "models/lm/generate.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

// The random model transformers makes: vocab 300 pads to 320 here.
constexpr int64_t kVocab = 300, kLayers = 2, kHeads = 4, kWidth = 64, kPositions = 32;

models::ModelOptions gpt_options(const std::string& init_from) {
  models::ModelOptions o;
  o.name = "gpt";
  o.preset = "gpt2";  // the file's dimensions replace the preset's
  o.init_from = init_from;
  return o;
}

core::Shape token_shape(int64_t vocab, int64_t context) {
  core::Shape s;
  s.vocab_size = vocab;
  s.context = context;
  return s;
}

// One random transformers model for the suite (python's start-up is the slow part).
class HfGpt2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    made_ =
        test::run_hf_script("hf_gpt2.py",
                            fmt::format("make {} --vocab {} --layers {} --heads {} --width {} "
                                        "--positions {} --seed 3",
                                        dir_->path(), kVocab, kLayers, kHeads, kWidth, kPositions),
                            *dir_);
    if (made_) expected_ = io::read_safetensors(dir_->file("expected.safetensors"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_) << "the transformers model was not made"; }

  static std::shared_ptr<models::Gpt> load() {
    return std::dynamic_pointer_cast<models::Gpt>(
        models::create_model(gpt_options(dir_->path()), token_shape(kVocab, kPositions / 2)));
  }

  static test::TempDir* dir_;
  static bool made_;
  static std::map<std::string, at::Tensor> expected_;
};
test::TempDir* HfGpt2::dir_ = nullptr;
bool HfGpt2::made_ = false;
std::map<std::string, at::Tensor> HfGpt2::expected_;

TEST_F(HfGpt2, InitFromGivesTransformersLogits) {
  const auto gpt = load();
  ASSERT_TRUE(gpt);
  const models::GptOptions& o = gpt->options();
  // Dimensions from config.json, not the gpt2 preset; context from n_positions, not the data's.
  EXPECT_EQ(o.num_layers, kLayers);
  EXPECT_EQ(o.heads, kHeads);
  EXPECT_EQ(o.d_model, kWidth);
  EXPECT_EQ(o.context, kPositions);
  EXPECT_EQ(o.padded_vocab_size, 320);
  gpt->eval();
  at::NoGradGuard no_grad;
  const at::Tensor logits = gpt->forward(expected_.at("inputs").to(at::kLong));
  const at::Tensor real = logits.narrow(-1, 0, kVocab);
  const double diff = test::max_abs_diff(real, expected_.at("logits"));
  EXPECT_LT(diff, 1e-4) << "logits differ from transformers' by up to " << diff;
  // The padded rows of wte are zero (hf_gpt2.h says why).
  for (const auto& item : gpt->named_parameters()) {
    if (item.key() == "wte.weight") {
      EXPECT_EQ(item.value().narrow(0, kVocab, 320 - kVocab).abs().max().item<float>(), 0.0f);
    }
  }
}

TEST_F(HfGpt2, GreedyGenerationEqualsTransformers) {
  const auto gpt = load();
  models::SamplingOptions s;
  s.temperature = 0;
  s.max_new_tokens = expected_.at("greedy").numel();
  const auto ids = models::generate(*gpt, test::ids_of(expected_.at("prompt")), s);
  EXPECT_EQ(ids, test::ids_of(expected_.at("greedy")));
  // Generation puts the training mode back.
  EXPECT_TRUE(gpt->is_training());
}

TEST_F(HfGpt2, KvCacheEqualsRecomputing) {
  const auto gpt = load();
  const std::vector<int64_t> prompt = test::ids_of(expected_.at("prompt"));
  for (const double temperature : {0.0, 1.0}) {
    models::SamplingOptions s;
    s.temperature = temperature;
    s.top_k = 50;
    s.seed = 7;
    s.max_new_tokens = 100;  // more than fits: stops when the context is full
    s.use_cache = true;
    const auto cached = models::generate(*gpt, prompt, s);
    s.use_cache = false;
    const auto recomputed = models::generate(*gpt, prompt, s);
    EXPECT_EQ(cached, recomputed) << "temperature " << temperature;
    EXPECT_EQ(cached.size(), kPositions - prompt.size());
  }
  // The logits, position by position and in chunks, against one forward of the whole sequence.
  gpt->eval();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, kVocab, {2, kPositions}, at::kLong);
  const at::Tensor full = gpt->forward(tokens);
  models::KvCache cache;
  std::vector<at::Tensor> parts;
  for (const auto& [start, len] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 1}, {6, 10}, {16, 16}}) {
    parts.push_back(gpt->forward_cached(tokens.narrow(1, start, len), cache));
  }
  EXPECT_EQ(cache.length(), kPositions);
  EXPECT_LT(test::max_abs_diff(at::cat(parts, 1), full), 1e-5);
  EXPECT_THROW(gpt->forward_cached(tokens.narrow(1, 0, 1), cache), std::invalid_argument);
}

TEST_F(HfGpt2, ExportLoadsInTransformersWithTheSameLogits) {
  models::GptOptions o;
  o.vocab_size = kVocab;
  o.context = 24;
  o.num_layers = 3;
  o.heads = 2;
  o.d_model = 32;
  at::manual_seed(11);
  models::Gpt gpt(o);
  {
    at::NoGradGuard no_grad;  // LayerNorms and biases away from 1 and 0, as after training
    for (auto& p : gpt.parameters()) p.add_(at::randn_like(p) * 0.05);
  }
  test::TempDir out;
  const auto files = models::export_hf_gpt2(gpt, out.path(), io::parse_shard_size("5GB"));
  EXPECT_EQ(files, std::vector<std::string>{out.file("model.safetensors")});
  const at::Tensor inputs = at::randint(0, kVocab, {2, 24}, at::kLong);
  io::write_safetensors(out.file("inputs.safetensors"), {{"inputs", inputs}});
  ASSERT_TRUE(
      test::run_hf_script("hf_gpt2.py",
                          fmt::format("logits {} {} {}", out.path(), out.file("inputs.safetensors"),
                                      out.file("hf_logits.safetensors")),
                          out));
  const at::Tensor theirs = io::read_safetensors(out.file("hf_logits.safetensors")).at("logits");
  gpt.eval();
  at::NoGradGuard no_grad;
  const at::Tensor mine = gpt.forward(inputs).narrow(-1, 0, kVocab);
  ASSERT_EQ(theirs.sizes(), mine.sizes());
  EXPECT_LT(test::max_abs_diff(mine, theirs), 1e-4);
  // And back: the exported directory loads through model.init_from to the same parameters.
  const auto back = std::dynamic_pointer_cast<models::Gpt>(
      models::create_model(gpt_options(out.path()), token_shape(kVocab, 24)));
  const auto again = back->named_parameters();
  for (const auto& item : gpt.named_parameters()) {
    // wte's padded rows come back as zeros (hf_gpt2.h); the rest is the same.
    const int64_t rows = item.key() == "wte.weight" ? kVocab : item.value().size(0);
    EXPECT_TRUE(at::equal(item.value().narrow(0, 0, rows), again[item.key()].narrow(0, 0, rows)))
        << item.key();
  }
  // Above --max-shard-size: shards and an index (models/lm/hf_format.h), which read back the same.
  test::TempDir sharded;
  const auto shards = models::export_hf_gpt2(gpt, sharded.path(), 20000);
  EXPECT_GT(shards.size(), 2u);
  EXPECT_EQ(shards.back(), sharded.file("model.safetensors.index.json"));
  const auto from_shards = std::dynamic_pointer_cast<models::Gpt>(
      models::create_model(gpt_options(sharded.path()), token_shape(kVocab, 24)));
  auto read = from_shards->named_parameters();
  for (const auto& item : back->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), read[item.key()])) << item.key();
  }
}

TEST_F(HfGpt2, InitFromErrorsNameTheFileAndBothShapes) {
  // A missing file.
  try {
    models::create_model(gpt_options("/no/such/gpt2"), token_shape(kVocab, 16));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.init_from: /no/such/gpt2: no such file or directory"));
  }
  // A dimension the config sets that the file does not have.
  auto o = gpt_options(dir_->path());
  o.d_model = 128;
  try {
    models::create_model(o, token_shape(kVocab, 16));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("has width 64, the config has model.d_model = 128"));
  }
  // Another vocabulary.
  try {
    models::create_model(gpt_options(dir_->path()), token_shape(256, 16));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("a vocabulary of 300 (wte.weight [300, 64]), the config has "
                                    "data.vocab_size = 256"));
  }
  // A tensor of the wrong shape: both shapes named, in the model's layout.
  test::TempDir bad;
  auto tensors = io::read_safetensors(dir_->file("model.safetensors"));
  tensors["transformer.h.1.mlp.c_fc.weight"] = at::zeros({64, 200});
  io::write_safetensors(bad.file("model.safetensors"), tensors, {{"format", "pt"}});
  auto bare = gpt_options(bad.file("model.safetensors"));
  bare.heads = kHeads;  // no config.json beside the file: the heads come from the config
  try {
    models::create_model(bare, token_shape(kVocab, 16));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("h.1.mlp.c_fc.weight has shape [200, 64] (after the Conv1D "
                                    "transpose) but the model's is [256, 64]"));
  }
  // An untied output layer.
  tensors = io::read_safetensors(dir_->file("model.safetensors"));
  tensors["lm_head.weight"] = at::ones({kVocab, kWidth});
  io::write_safetensors(bad.file("model.safetensors"), tensors, {{"format", "pt"}});
  try {
    models::create_model(bare, token_shape(kVocab, 16));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("lm_head.weight [300, 64] is not wte.weight [300, 64]: an "
                                    "untied output layer"));
  }
}

}  // namespace TRAINER_UNITY_ID
