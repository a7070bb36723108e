// Llama's kin (Qwen2, Qwen3, Mistral, Gemma 3: models/llama/llama_family.h) in and out of Hugging
// Face's format, against `transformers` itself (tests/hf/hf_llama.py, offline, random models of odd
// shapes: grouped-query attention, a head_dim other than hidden / heads, tied and untied
// embeddings, a sliding window shorter than the prompt): model.init_from gives transformers'
// logits; greedy generation past the window equals generate(do_sample=False); an export through
// the registry loads with from_pretrained as the same class with the same logits; the loss and
// every gradient of one batch equal transformers' in float32 (no PyTorch twin: transformers is the
// reference). And every preset has the published model's parameter count.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "models/deferred_init.h"
#include "models/llama/hf_llama.h"
#include "models/llama/llama.h"
#include "models/lm/causal_lm.h"
#include "models/lm/generate.h"
#include "models/lm/hf_ranges.h"
#include "models/lm/lm_shape.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 300, kPositions = 64;

// Per family: (tied, a window of 5 positions of the 37 generation sees, GQA 6 over 2 of 8) and
// (untied, 5 heads over 1 of 12 in a 40-wide model, biases where the family has them; Gemma 3
// a window of 7 on its sliding layers, linear rope scaling on its full ones).
struct Made {
  const char* family;
  const char* preset;
  const char* args;
  int64_t window;
  const char* model_type = nullptr;  // config.json's (null: the family)
};
constexpr Made kModels[] = {
    {"qwen2", "qwen2-tiny",
     "--model-type qwen2 --layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 "
     "--window 5",
     5},
    {"qwen2", "qwen2-tiny",
     "--model-type qwen2 --layers 3 --heads 5 --kv-heads 1 --width 40 --head-dim 12 "
     "--intermediate 56 --untied --theta 500",
     0},
    {"qwen3", "qwen3-tiny",
     "--model-type qwen3 --layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 "
     "--window 5 --max-shard-size 40KB",
     5},
    {"qwen3", "qwen3-tiny",
     "--model-type qwen3 --layers 3 --heads 5 --kv-heads 1 --width 40 --head-dim 12 "
     "--intermediate 56 --untied --bias --theta 500",
     0},
    {"mistral", "mistral-tiny",
     "--model-type mistral --layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 "
     "--window 5",
     5},
    {"mistral", "mistral-tiny",
     "--model-type mistral --layers 3 --heads 5 --kv-heads 1 --width 40 --head-dim 12 "
     "--intermediate 56 --untied --theta 500",
     0},
    {"gemma3", "gemma3-tiny",
     "--model-type gemma3 --layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 "
     "--window 5",
     5, "gemma3_text"},
    {"gemma3", "gemma3-tiny",
     "--model-type gemma3 --layers 3 --heads 5 --kv-heads 1 --width 40 --head-dim 12 "
     "--intermediate 56 --untied --bias --theta 500 --rope-scaling --window 7",
     7, "gemma3_text"},
};
constexpr size_t kMade = sizeof(kModels) / sizeof(kModels[0]);

// model.init_from through the registry, as the trainer builds it.
std::shared_ptr<models::Llama> load(const Made& m, const std::string& dir) {
  models::ModelOptions o;
  o.name = m.family;
  o.preset = m.preset;  // the file's architecture replaces the preset's
  o.tie_embeddings = "auto";
  o.init_from = dir;
  core::Shape s;
  s.vocab_size = kVocab;
  s.context = kPositions / 2;
  return std::dynamic_pointer_cast<models::Llama>(models::create_model(o, s));
}

class HfKin : public ::testing::TestWithParam<size_t> {
 protected:
  static void SetUpTestSuite() {
    for (size_t i = 0; i < kMade; ++i) {
      dirs_[i] = new test::TempDir();
      made_[i] = test::run_hf_script(
          "hf_llama.py",
          fmt::format("make {} --vocab {} --positions {} --seed {} {}", dirs_[i]->path(), kVocab,
                      kPositions, 7 + i, kModels[i].args),
          *dirs_[i]);
      if (made_[i]) expected_[i] = io::read_safetensors(dirs_[i]->file("expected.safetensors"));
    }
  }
  static void TearDownTestSuite() {
    for (auto*& d : dirs_) {
      delete d;
      d = nullptr;
    }
  }
  void SetUp() override { ASSERT_TRUE(made_[GetParam()]) << "the transformers model was not made"; }
  const Made& made() const { return kModels[GetParam()]; }
  const std::string& dir() const { return dirs_[GetParam()]->path(); }
  const std::map<std::string, at::Tensor>& expected() const { return expected_[GetParam()]; }

  static test::TempDir* dirs_[kMade];
  static bool made_[kMade];
  static std::map<std::string, at::Tensor> expected_[kMade];
};
test::TempDir* HfKin::dirs_[kMade] = {};
bool HfKin::made_[kMade] = {};
std::map<std::string, at::Tensor> HfKin::expected_[kMade];

TEST_P(HfKin, InitFromGivesTransformersLogits) {
  const auto model = load(made(), dir());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->options().family, made().family);
  EXPECT_EQ(model->options().sliding_window, made().window);
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(expected().at("inputs").to(at::kLong));
  const double diff = test::max_abs_diff(logits.narrow(-1, 0, kVocab), expected().at("logits"));
  EXPECT_LT(diff, 1e-4) << "logits differ from transformers' by up to " << diff;
}

// model.sliding_window set over model.init_from must be the file's.
TEST_P(HfKin, ASlidingWindowKeyOtherThanTheFilesNamesBoth) {
  models::ModelOptions o;
  o.name = made().family;
  o.preset = made().preset;
  o.tie_embeddings = "auto";
  o.sliding_window = made().window + 3;
  o.init_from = dir();
  core::Shape s;
  s.vocab_size = kVocab;
  s.context = kPositions / 2;
  EXPECT_THAT([&] { models::create_model(o, s); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr(fmt::format("has a sliding window of {} (0: none), the config has "
                                        "model.sliding_window = {}",
                                        made().window, made().window + 3))));
}

TEST_P(HfKin, GreedyGenerationPastTheWindowEqualsTransformers) {
  const auto model = load(made(), dir());
  models::SamplingOptions s;
  s.temperature = 0;
  s.max_new_tokens = expected().at("greedy").numel();
  ASSERT_GE(s.max_new_tokens, 24);
  EXPECT_EQ(models::generate(*model, test::ids_of(expected().at("prompt")), s),
            test::ids_of(expected().at("greedy")));
}

TEST_P(HfKin, ExportLoadsInTransformersAsTheSameClassWithTheSameLogits) {
  const auto model = load(made(), dir());
  {
    at::NoGradGuard no_grad;  // away from the imported weights: the export must carry these
    for (auto& p : model->parameters()) p.add_(at::randn_like(p) * 0.02);
  }
  test::TempDir out;
  const models::HfExport written = models::export_hf(made().family, *model, out.path(), 30000, {});
  std::ifstream config(out.file("config.json"));
  const nlohmann::json c = nlohmann::json::parse(config);
  EXPECT_EQ(c.at("model_type"), made().model_type ? made().model_type : made().family);
  EXPECT_EQ(c.at("architectures").at(0), written.hf_class);
  const at::Tensor inputs = at::randint(0, kVocab, {2, kPositions}, at::kLong);
  io::write_safetensors(out.file("inputs.safetensors"), {{"inputs", inputs}});
  ASSERT_TRUE(
      test::run_hf_script("hf_llama.py",
                          fmt::format("logits {} {} {}", out.path(), out.file("inputs.safetensors"),
                                      out.file("hf_logits.safetensors")),
                          out));
  const at::Tensor theirs = io::read_safetensors(out.file("hf_logits.safetensors")).at("logits");
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor mine = model->forward(inputs).narrow(-1, 0, kVocab);
  ASSERT_EQ(theirs.sizes(), mine.sizes());
  EXPECT_LT(test::max_abs_diff(mine, theirs), 1e-4);
  const auto back = load(made(), out.path());  // and back: the same parameters
  auto again = back->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const bool vocab = item.key() == "embed_tokens.weight" || item.key() == "lm_head.weight";
    const int64_t rows = vocab ? kVocab : item.value().size(0);
    EXPECT_TRUE(at::equal(item.value().narrow(0, 0, rows), again[item.key()].narrow(0, 0, rows)))
        << item.key();
  }
}

TEST_P(HfKin, LossAndGradientsEqualTransformers) {
  const auto model = load(made(), dir());
  const at::Tensor inputs = expected().at("inputs").to(at::kLong);
  const auto theirs = io::read_safetensors(dirs_[GetParam()]->file("grads.safetensors"));
  model->train();
  const int64_t t = inputs.size(1);
  const at::Tensor loss = model->loss(inputs.narrow(1, 0, t - 1), inputs.narrow(1, 1, t - 1));
  loss.backward();
  EXPECT_LT(std::abs(loss.item<double>() - theirs.at("loss").item<double>()), 1e-4);
  // Each of transformers' gradients as rows of one of the model's (llama_hf_map: q, k and v rows
  // of qkv_proj, the real vocabulary of the embedding).
  const models::ParameterShapes shapes = models::parameter_shapes(*model);
  auto params = model->named_parameters();
  size_t compared = 0;
  for (const models::HfTensor& e : models::llama_hf_map(model->options(), shapes)) {
    if (e.check_only) continue;
    ASSERT_TRUE(theirs.count(e.name)) << e.name;
    const at::Tensor mine = params[e.param].grad().narrow(0, e.row_begin, e.rows);
    const at::Tensor& their = theirs.at(e.name);
    ASSERT_EQ(mine.sizes(), their.sizes()) << e.name;
    EXPECT_LT(test::max_abs_diff(mine, their), 1e-4) << e.name;
    ++compared;
  }
  EXPECT_EQ(compared + 1, theirs.size());  // every gradient but the loss
}

INSTANTIATE_TEST_SUITE_P(TiedWindowedAndUntied, HfKin, ::testing::Range<size_t>(0, kMade));

// A preset's parameters (the padded vocabulary's rows counted as the file's), built without
// storage as the planner builds it.
int64_t preset_parameters(const std::string& family, const std::string& preset, int64_t vocab) {
  models::DeferredInit scope(c10::Device(c10::kCPU));
  models::ModelOptions o;
  o.name = family;
  o.preset = preset;
  o.tie_embeddings = "auto";
  core::Shape s;
  s.vocab_size = vocab;
  s.context = 8;
  const auto model = std::dynamic_pointer_cast<models::CausalLm>(models::create_model(o, s));
  const models::LmShape shape = model->lm_shape();
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, shape.parameter_count()) << preset << ": the plan's count and the model's differ";
  const int64_t padded_rows = (shape.padded_vocab - vocab) * shape.d_model;
  return n - padded_rows * (shape.tied ? 1 : 2);
}

// The published models' parameter counts (their model cards: Qwen3-0.6B 0.6B of which 0.44B
// outside the embedding, ...; each the sum over their safetensors' tensors).
TEST(KinPresets, HaveThePublishedModelsParameterCounts) {
  EXPECT_EQ(preset_parameters("qwen3", "qwen3-0.6b", 151936), 596049920);
  EXPECT_EQ(preset_parameters("qwen3", "qwen3-1.7b", 151936), 1720574976);
  EXPECT_EQ(preset_parameters("qwen3", "qwen3-4b", 151936), 4022468096);
  EXPECT_EQ(preset_parameters("qwen3", "qwen3-8b", 151936), 8190735360);
  EXPECT_EQ(preset_parameters("qwen3", "qwen3-14b", 151936), 14768307200);
  EXPECT_EQ(preset_parameters("qwen2", "qwen2.5-0.5b", 151936), 494032768);
  EXPECT_EQ(preset_parameters("qwen2", "qwen2.5-1.5b", 151936), 1543714304);
  EXPECT_EQ(preset_parameters("qwen2", "qwen2.5-7b", 152064), 7615616512);
  EXPECT_EQ(preset_parameters("mistral", "mistral-7b-v0.3", 32768), 7248023552);
  // Gemma 3 1B's model card: 999,885,952 (tied). The 4B's text model from its text_config (34
  // blocks, 2560 wide, 8 heads over 4 of 256, MLP 10240, vocab 262208, tied; its safetensors'
  // language_model tensors): 3,880,263,168 of its 4.3B with the vision tower.
  EXPECT_EQ(preset_parameters("gemma3", "gemma-3-1b", 262144), 999885952);
  EXPECT_EQ(preset_parameters("gemma3", "gemma-3-4b", 262208), 3880263168);
  // Llama 3.1's output layer is its own (tied before: 7.50B for the 8B).
  EXPECT_EQ(preset_parameters("llama", "llama-3.1-8b", 128256), 8030261248);
  EXPECT_EQ(preset_parameters("llama", "llama-3.1-70b", 128256), 70553706496);
}

// What each family's config.json may not say names the key and the file.
TEST(KinErrors, ConfigValuesTheFamilyCannotTakeNameTheKey) {
  test::TempDir dir;
  const auto error = [&](const std::string& family, const std::string& json) {
    std::ofstream(dir.file("config.json")) << json;
    io::write_safetensors(dir.file("model.safetensors"), {{"model.norm.weight", at::ones({64})}});
    models::ModelOptions o;
    o.name = family;
    o.preset = family + "-tiny";
    o.tie_embeddings = "auto";
    o.init_from = dir.path();
    core::Shape s;
    s.vocab_size = 300;
    s.context = 16;
    try {
      models::create_model(o, s);
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(dir.file("config.json")));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 300)";
  EXPECT_THAT(error("qwen3", "{" + base + R"(, "model_type": "qwen2"})"),
              HasSubstr("model_type = \"qwen2\": not a Qwen3ForCausalLM"));
  EXPECT_THAT(error("qwen2", "{" + base +
                                 R"(, "model_type": "qwen2", "use_sliding_window": true,
      "sliding_window": 8, "layer_types": ["full_attention"]})"),
              HasSubstr("layer_types"));
  EXPECT_THAT(error("qwen2", "{" + base +
                                 R"(, "model_type": "qwen2", "use_sliding_window": true,
      "sliding_window": 8, "layer_types": ["full_attention", "chunked_attention"]})"),
              HasSubstr("chunked_attention"));
  EXPECT_THAT(
      error("qwen3", "{" + base + R"(, "model_type": "qwen3", "use_sliding_window": true})"),
      HasSubstr("sliding_window"));
  EXPECT_THAT(error("mistral", "{" + base +
                                   R"(, "model_type": "mistral", "layer_types": ["full_attention",
      "sliding_attention"]})"),
              HasSubstr("layer_types"));
  EXPECT_THAT(error("mistral", "{" + base + R"(, "model_type": "mistral", "sliding_window": -4})"),
              HasSubstr("sliding_window"));
  EXPECT_THAT(error("gemma3", "{" + base +
                                  R"(, "model_type": "gemma3_text",
      "final_logit_softcapping": 30.0})"),
              HasSubstr("final_logit_softcapping"));
  EXPECT_THAT(error("gemma3", "{" + base +
                                  R"(, "model_type": "gemma3_text", "rope_parameters": {
      "full_attention": {"rope_type": "yarn", "factor": 4.0}}})"),
              HasSubstr("rope_parameters.full_attention"));
  // The multimodal model's config.json: its text_config is the text model's.
  EXPECT_THAT(error("gemma3", R"({"model_type": "gemma3", "architectures":
      ["Gemma3ForConditionalGeneration"], "text_config": {)" +
                                  base + R"(}, "vision_config": {"hidden_size": 1152}})"),
              HasSubstr("vision_config: a multimodal model's config"));
}

}  // namespace TRAINER_UNITY_ID
