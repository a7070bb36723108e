// Hugging Face Llama weights in and out (models/llama/hf_llama.h, io/safetensors_shards.h)
// and greedy generation, against `transformers` itself (tests/hf/hf_llama.py, offline, random
// models of odd shapes): a LlamaForCausalLM saved with save_pretrained (sharded, or one file)
// loads through model.init_from with the same logits; greedy generation equals transformers'
// generate(do_sample=False) token for token; a model written by export_hf_llama (sharded too)
// loads with from_pretrained, no key missing or unexpected, with the same logits, and reads back
// to the same parameters; errors in a config.json name the file.
#include "models/llama/hf_llama.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "models/llama/llama.h"
#include "models/lm/generate.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 300, kPositions = 32;

// model.init_from through the registry, as the trainer builds it.
std::shared_ptr<models::Llama> load(const std::string& dir) {
  models::ModelOptions o;
  o.name = "llama";
  o.preset = "llama-tiny";  // the file's architecture replaces the preset's
  o.init_from = dir;
  core::Shape s;
  s.vocab_size = kVocab;
  s.context = kPositions / 2;
  return std::dynamic_pointer_cast<models::Llama>(models::create_model(o, s));
}

// Two random transformers models: (tied, 6 heads over 2, head 8, sharded) and (untied, 5 heads
// over 1 of 12 in a 40-wide model, llama3 rope scaling, biases, one file).
struct Made {
  const char* args;
  bool sharded;
};
constexpr Made kModels[] = {
    {"--layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 --max-shard-size 40KB", true},
    {"--layers 3 --heads 5 --kv-heads 1 --width 40 --head-dim 12 --intermediate 56 --untied "
     "--rope-scaling --bias --theta 500",
     false},
};

class HfLlama : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < 2; ++i) {
      dirs_[i] = new test::TempDir();
      made_[i] = test::run_hf_script(
          "hf_llama.py",
          fmt::format("make {} --vocab {} --positions {} --seed {} {}", dirs_[i]->path(), kVocab,
                      kPositions, 3 + i, kModels[i].args),
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
  const std::string& dir() const { return dirs_[GetParam()]->path(); }
  const std::map<std::string, at::Tensor>& expected() const { return expected_[GetParam()]; }

  static test::TempDir* dirs_[2];
  static bool made_[2];
  static std::map<std::string, at::Tensor> expected_[2];
};
test::TempDir* HfLlama::dirs_[2] = {};
bool HfLlama::made_[2] = {};
std::map<std::string, at::Tensor> HfLlama::expected_[2];

TEST_P(HfLlama, InitFromGivesTransformersLogits) {
  EXPECT_EQ(std::filesystem::exists(dir() + "/model.safetensors.index.json"),
            kModels[GetParam()].sharded);
  const auto llama = load(dir());
  ASSERT_TRUE(llama);
  EXPECT_EQ(llama->options().context, kPositions);  // max_position_embeddings, not the data's
  llama->eval();
  at::NoGradGuard no_grad;
  const at::Tensor logits = llama->forward(expected().at("inputs").to(at::kLong));
  const double diff = test::max_abs_diff(logits.narrow(-1, 0, kVocab), expected().at("logits"));
  EXPECT_LT(diff, 1e-4) << "logits differ from transformers' by up to " << diff;
}

TEST_P(HfLlama, GreedyGenerationEqualsTransformers) {
  const auto llama = load(dir());
  models::SamplingOptions s;
  s.temperature = 0;
  s.max_new_tokens = expected().at("greedy").numel();
  EXPECT_EQ(models::generate(*llama, test::ids_of(expected().at("prompt")), s),
            test::ids_of(expected().at("greedy")));
}

TEST_P(HfLlama, ExportLoadsInTransformersWithTheSameLogits) {
  const auto llama = load(dir());
  {
    at::NoGradGuard no_grad;  // away from the imported weights: the export must carry these
    for (auto& p : llama->parameters()) p.add_(at::randn_like(p) * 0.02);
  }
  test::TempDir out;
  const auto files = models::export_hf_llama(*llama, llama->options(), out.path(), 30000);
  EXPECT_GT(files.size(), 2u);  // shards and the index
  EXPECT_EQ(files.back(), out.file("model.safetensors.index.json"));
  const at::Tensor inputs = at::randint(0, kVocab, {2, kPositions}, at::kLong);
  io::write_safetensors(out.file("inputs.safetensors"), {{"inputs", inputs}});
  ASSERT_TRUE(
      test::run_hf_script("hf_llama.py",
                          fmt::format("logits {} {} {}", out.path(), out.file("inputs.safetensors"),
                                      out.file("hf_logits.safetensors")),
                          out));
  const at::Tensor theirs = io::read_safetensors(out.file("hf_logits.safetensors")).at("logits");
  llama->eval();
  at::NoGradGuard no_grad;
  const at::Tensor mine = llama->forward(inputs).narrow(-1, 0, kVocab);
  ASSERT_EQ(theirs.sizes(), mine.sizes());
  EXPECT_LT(test::max_abs_diff(mine, theirs), 1e-4);
  // And back: the same parameters (the padded rows come back zero).
  const auto back = load(out.path());
  auto again = back->named_parameters();
  for (const auto& item : llama->named_parameters()) {
    const bool vocab = item.key() == "embed_tokens.weight" || item.key() == "lm_head.weight";
    const int64_t rows = vocab ? kVocab : item.value().size(0);
    EXPECT_TRUE(at::equal(item.value().narrow(0, 0, rows), again[item.key()].narrow(0, 0, rows)))
        << item.key();
  }
  // One file below the shard size; the earlier export's shards are gone.
  models::export_hf_llama(*llama, llama->options(), out.path(), io::parse_shard_size("5GB"));
  EXPECT_EQ(io::safetensors_files(out.path()),
            std::vector<std::string>{out.file("model.safetensors")});
  EXPECT_FALSE(std::filesystem::exists(out.file("model.safetensors.index.json")));
}

INSTANTIATE_TEST_SUITE_P(TiedShardedAndUntiedScaled, HfLlama, ::testing::Values(0, 1));

std::string write_config(const test::TempDir& dir, const std::string& json) {
  std::ofstream(dir.file("config.json")) << json;
  io::write_safetensors(dir.file("model.safetensors"), {{"model.norm.weight", at::ones({64})}});
  return dir.file("config.json");
}

TEST(HfLlamaErrors, AnInvalidConfigValueNamesTheFile) {
  test::TempDir dir;
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "vocab_size": 300, "model_type": "llama")";
  const auto error = [&](const std::string& extra) {
    const std::string file = write_config(dir, "{" + base + ", " + extra + "}");
    try {
      models::read_llama_init(dir.path());
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(file));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error(R"("num_attention_heads": 5)"),
              HasSubstr("model.heads (5) must divide model.d_model (64)"));
  EXPECT_THAT(error(R"("num_attention_heads": 4, "num_key_value_heads": 3)"),
              HasSubstr("model.kv_heads (3) must divide model.heads (4)"));
  EXPECT_THAT(
      error(R"("num_attention_heads": 4, "rope_scaling": {"rope_type": "yarn", "factor": 2})"),
      HasSubstr("rope type 'yarn'"));
  EXPECT_THAT(error(R"("num_attention_heads": 4, "hidden_act": "gelu")"), HasSubstr("hidden_act"));
  EXPECT_THAT(error(R"("num_attention_heads": 4, "rms_norm_eps": -1)"), HasSubstr("rms_norm_eps"));
  EXPECT_THAT(error(R"("num_attention_heads": "4")"), HasSubstr("num_attention_heads"));
}

// The same for GPT-2: n_head 5 in a 64-wide config.json.
TEST(HfLlamaErrors, AGpt2ConfigValueNamesTheFileToo) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << R"({"model_type": "gpt2", "n_layer": 1, "n_head": 5,
      "n_embd": 64, "n_positions": 16, "vocab_size": 300})";
  io::write_safetensors(dir.file("model.safetensors"), {{"wte.weight", at::zeros({300, 64})},
                                                        {"wpe.weight", at::zeros({16, 64})}});
  models::ModelOptions o;
  o.name = "gpt";
  o.preset = "tiny";
  o.init_from = dir.path();
  core::Shape s;
  s.vocab_size = 300;
  s.context = 16;
  try {
    models::create_model(o, s);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.heads (5) must divide model.d_model (64)"));
    EXPECT_THAT(e.what(), HasSubstr(dir.file("config.json")));
  }
}

TEST(SafetensorsShards, SizesAndABrokenIndex) {
  EXPECT_EQ(io::parse_shard_size("5GB"), 5000000000);
  EXPECT_EQ(io::parse_shard_size("2MiB"), 2097152);
  EXPECT_EQ(io::parse_shard_size("1000"), 1000);
  EXPECT_THROW(io::parse_shard_size("5 parsecs"), std::invalid_argument);
  test::TempDir dir;
  const std::map<std::string, at::Tensor> t = {
      {"a", at::ones({100})}, {"b", at::zeros({100})}, {"c", at::ones({3})}};
  const auto files = io::write_safetensors_dir(dir.path(), t, 500, {});
  ASSERT_EQ(files.size(), 3u);  // a | b c | index
  const auto back = io::read_safetensors_dir(dir.path());
  EXPECT_EQ(back.size(), 3u);
  EXPECT_TRUE(at::equal(back.at("b"), t.at("b")));
  std::filesystem::remove(files[1]);
  EXPECT_THAT([&] { io::read_safetensors_dir(dir.path()); },
              ::testing::ThrowsMessage<io::SafetensorsError>(HasSubstr(files[1])));
}

}  // namespace TRAINER_UNITY_ID
