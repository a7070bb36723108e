// LoRA adapters in and out against PEFT itself (tests/hf/lora_peft.py, offline, random bases
// that tests/hf/hf_llama.py and hf_gpt2.py make): after a few steps of training the adapters
// (B away from zero), the trainer's logits equal PeftModel.from_pretrained's on the exported
// adapter (--export-peft's export_peft) within 1e-4, with no key missing or unexpected, and the
// merged export (--export-hf) equals PEFT's merge_and_unload() within 1e-5, for llama (grouped
// queries, untied) and gpt; model.lora_init_from on an adapter PEFT wrote (random B) gives
// PEFT's logits; an adapter of another rank, other targets or another PEFT type is refused
// naming the file and the key. rsLoRA (model.lora_rslora, PEFT's use_rslora: scale alpha /
// sqrt(r)) both ways at no extra Python run: gpt's export and llama's lora_init_from use it, the
// other family's the plain scale. The fields of PEFT's that are not plain LoRA (use_dora,
// alpha_pattern, ...) are refused by name.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "models/lm/causal_lm.h"
#include "models/lm/lora.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 300, kPositions = 32;

struct Family {
  const char* name;    // model.name
  const char* script;  // what makes its random base
  const char* make_args;
  std::vector<std::string> targets;
};
const Family kFamilies[] = {
    {"llama",
     "hf_llama.py",
     "--layers 2 --heads 6 --kv-heads 2 --width 48 --intermediate 100 --untied",
     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
    {"gpt", "hf_gpt2.py", "--layers 2 --heads 4 --width 32", {"c_attn", "c_proj", "c_fc"}},
    // Llama's kin with the same names: Qwen3's q and k norms, head_dim 12, a window of 5.
    {"qwen3",
     "hf_llama.py",
     "--model-type qwen3 --layers 2 --heads 6 --kv-heads 2 --width 48 --head-dim 12 "
     "--intermediate 100 --window 5",
     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
    // Gemma 3: sandwich norms, GeGLU, the embedding scale, a window of 5 on its sliding layers.
    {"gemma3",
     "hf_llama.py",
     "--model-type gemma3 --layers 2 --heads 6 --kv-heads 2 --width 48 --head-dim 12 "
     "--intermediate 100 --window 5",
     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
};
constexpr int kFamilyCount = sizeof(kFamilies) / sizeof(kFamilies[0]);

models::ModelOptions options(const Family& f, const std::string& base, int64_t rank) {
  models::ModelOptions o;
  o.name = f.name;
  const std::string name = f.name;
  o.preset = name == "gpt" ? "tiny" : name + "-tiny";
  o.tie_embeddings = "auto";
  o.init_from = base;
  o.lora_rank = rank;
  o.lora_alpha = 12.0;
  o.lora_targets = f.targets;
  return o;
}

std::shared_ptr<models::CausalLm> build(const models::ModelOptions& o) {
  core::Shape s;
  s.vocab_size = kVocab;
  s.context = kPositions / 2;
  return std::dynamic_pointer_cast<models::CausalLm>(models::create_model(o, s));
}

class LoraPeft : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < kFamilyCount; ++i) {
      const Family& f = kFamilies[i];
      dirs_[i] = new test::TempDir();
      made_[i] = test::run_hf_script(
          f.script,
          fmt::format("make {} --vocab {} --positions {} --seed {} {}", dirs_[i]->path(), kVocab,
                      kPositions, 11 + i, f.make_args),
          *dirs_[i]);
    }
  }
  static void TearDownTestSuite() {
    for (auto*& d : dirs_) {
      delete d;
      d = nullptr;
    }
  }
  void SetUp() override { ASSERT_TRUE(made_[GetParam()]) << "the transformers base was not made"; }
  const Family& family() const { return kFamilies[GetParam()]; }
  // rsLoRA on one path per family: gpt's export, llama's model.lora_init_from.
  bool rslora_out() const { return GetParam() == 1; }
  bool rslora_in() const { return GetParam() == 0; }
  const std::string& base() const { return dirs_[GetParam()]->path(); }
  at::Tensor inputs() const {
    return io::read_safetensors(base() + "/expected.safetensors").at("inputs").to(at::kLong);
  }

  static test::TempDir* dirs_[kFamilyCount];
  static bool made_[kFamilyCount];
};
test::TempDir* LoraPeft::dirs_[kFamilyCount] = {};
bool LoraPeft::made_[kFamilyCount] = {};

// A few steps of gradient descent on the adapters: B moves away from zero.
void train_a_little(models::CausalLm& model, const at::Tensor& tokens) {
  model.train();
  for (int step = 0; step < 4; ++step) {
    model.zero_grad();
    model.loss(tokens, at::roll(tokens, -1, 1)).backward();
    at::NoGradGuard no_grad;
    for (auto& p : model.parameters()) p.sub_(p.grad() * 2.0);
  }
  model.eval();
}

TEST_P(LoraPeft, ExportedAdapterGivesTheTrainersLogitsInPeftAndMergesAsPeft) {
  models::ModelOptions o = options(family(), base(), 4);
  o.lora_rslora = rslora_out();  // exported as use_rslora: PEFT must scale as the trainer did
  SCOPED_TRACE(o.lora_rslora ? "rsLoRA" : "LoRA");
  auto model = build(o);
  ASSERT_TRUE(model);
  const at::Tensor tokens = inputs();
  train_a_little(*model, tokens);
  test::TempDir out;
  const std::string adapter = out.file("adapter"), merged = out.file("merged");
  models::export_peft(*model, adapter, base());
  models::export_hf(family().name, *model, merged, 0);
  io::write_safetensors(out.file("in.safetensors"), {{"inputs", tokens}});
  ASSERT_TRUE(test::run_hf_script(
      "lora_peft.py",
      fmt::format("check {} {} {} {} --merged {}", base(), adapter, out.file("in.safetensors"),
                  out.file("out.safetensors"), merged),
      out));
  const auto peft = io::read_safetensors(out.file("out.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor mine = model->forward(tokens).narrow(-1, 0, kVocab);
  const double diff = test::max_abs_diff(mine, peft.at("logits"));
  EXPECT_LT(diff, 1e-4) << "the trainer's logits differ from PEFT's by up to " << diff;
  EXPECT_LT(peft.at("merged_diff").item<double>(), 1e-5)
      << "--export-hf's merged weights differ from merge_and_unload()'s";
  EXPECT_LT(test::max_abs_diff(peft.at("merged_logits"), peft.at("logits")), 1e-4);
  // The adapters moved the logits away from the base's: the comparison sees them.
  models::ModelOptions base_only = options(family(), base(), 0);
  base_only.lora_targets.clear();
  auto plain = build(base_only);
  plain->eval();
  EXPECT_GT(test::max_abs_diff(plain->forward(tokens).narrow(-1, 0, kVocab), mine), 1e-3);
}

TEST_P(LoraPeft, LoraInitFromAPeftAdapterGivesPeftsLogits) {
  test::TempDir out;
  const std::string adapter = out.file("adapter");
  io::write_safetensors(out.file("in.safetensors"), {{"inputs", inputs()}});
  ASSERT_TRUE(test::run_hf_script(
      "lora_peft.py",
      fmt::format("make {} {} {} {} --r 3 --alpha 12 {} --targets {}", base(), adapter,
                  out.file("in.safetensors"), out.file("out.safetensors"),
                  rslora_in() ? "--rslora" : "", fmt::join(family().targets, " ")),
      out));
  models::ModelOptions o = options(family(), base(), 3);
  o.lora_init_from = adapter;
  if (rslora_in()) {
    // PEFT's scale is alpha / sqrt(r): without model.lora_rslora, refused naming both.
    EXPECT_THAT([&] { build(o); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr(
                    "adapter_config.json: use_rslora is true but model.lora_rslora is false")));
    o.lora_rslora = true;
  }
  SCOPED_TRACE(o.lora_rslora ? "rsLoRA" : "LoRA");
  auto model = build(o);
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor mine = model->forward(inputs()).narrow(-1, 0, kVocab);
  const at::Tensor peft = io::read_safetensors(out.file("out.safetensors")).at("logits");
  EXPECT_LT(test::max_abs_diff(mine, peft), 1e-4);
  // Another rank, other targets: refused naming the file and the key.
  o.lora_rank = 2;
  EXPECT_THAT([&] { build(o); }, ::testing::ThrowsMessage<std::invalid_argument>(AllOf(
                                     HasSubstr("model.lora_init_from"),
                                     HasSubstr("adapter_config.json: r is 3 but model.lora_rank "
                                               "is 2"))));
  o.lora_rank = 3;
  o.lora_targets = {family().targets.front()};
  EXPECT_THAT([&] { build(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("target_modules")));
}

TEST_P(LoraPeft, AnotherPeftTypeIsRefusedNamingTheFile) {
  test::TempDir out;
  const std::string adapter = out.file("adapter");
  io::write_safetensors(out.file("in.safetensors"), {{"inputs", inputs()}});
  ASSERT_TRUE(
      test::run_hf_script("lora_peft.py",
                          fmt::format("make {} {} {} {} --r 3 --alpha 12 --peft-type IA3 "
                                      "--targets {}",
                                      base(), adapter, out.file("in.safetensors"),
                                      out.file("out.safetensors"), family().targets.front()),
                          out));
  models::ModelOptions o = options(family(), base(), 3);
  o.lora_init_from = adapter;
  EXPECT_THAT([&] { build(o); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                     HasSubstr("adapter_config.json: peft_type is IA3, not LORA")));
}

// What PEFT can save but the trainer does not compute (another scale per layer, DoRA, biases,
// some layers only) is refused naming the field, before any tensor is read; what PEFT writes by
// default (empty patterns, bias none) and fan_in_fan_out (PEFT sets it by the layer's type) load.
TEST_P(LoraPeft, FieldsThatAreNotPlainLoraAreRefusedByName) {
  test::TempDir out;
  const std::string adapter = out.file("adapter");
  models::export_peft(*build(options(family(), base(), 2)), adapter, base());
  const std::string config_path = adapter + "/adapter_config.json";
  nlohmann::json written;
  std::ifstream(config_path) >> written;
  const std::string target = family().targets.front();
  models::ModelOptions o = options(family(), base(), 2);
  o.lora_init_from = adapter;
  const auto load_with = [&](const std::string& field, const nlohmann::json& value) {
    nlohmann::json c = written;
    c[field] = value;
    std::ofstream(config_path) << c.dump(2);
    build(o);
  };
  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"use_dora", true}, {"alpha_pattern", {{target, 24}}}, {"rank_pattern", {{target, 1}}},
      {"bias", "all"},    {"layers_to_transform", {0}},      {"lora_bias", true}};
  for (const auto& [field, value] : refused) {
    SCOPED_TRACE(field);
    EXPECT_THAT([&] { load_with(field, value); },
                ::testing::ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("adapter_config.json: " + field + " is "),
                          HasSubstr("save the adapter without it"))));
  }
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"alpha_pattern", nlohmann::json::object()},
           {"rank_pattern", nlohmann::json::object()},
           {"bias", "none"},
           {"fan_in_fan_out", !written.at("fan_in_fan_out").get<bool>()}}) {
    SCOPED_TRACE(field);
    EXPECT_NO_THROW(load_with(field, value));
  }
}

// adapter_config.json whose fields have another JSON type than PEFT's (found by the peft_config
// fuzz target: a number in place of the object ended the trainer with nlohmann's type_error,
// exit 1, naming no file) is refused naming the file and the field.
TEST(LoraPeftConfig, FieldsOfAnotherTypeAreRefusedNamingThem) {
  test::TempDir out;
  const std::string path = out.file("adapter_config.json");
  models::LoraOptions options;
  options.rank = 2;
  options.alpha = 8.0;
  options.targets = {"q_proj"};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"18", "not a JSON object but 18"},
      {R"({"peft_type": 5})", "peft_type is 5, not a string"},
      {R"({"peft_type": "LORA", "r": "2"})", R"(r is "2", not an integer)"},
      {R"({"peft_type": "LORA", "r": 2.5})", "r is 2.5, not an integer"},
      {R"({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj", 3]})",
       "target_modules holds 3, which is not a module name"},
      {R"({"peft_type": "LORA", "r": 2, "target_modules": {"a": 1}})",
       "target_modules is {\"a\":1}, not a list of names"},
      {R"({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"], "lora_alpha": []})",
       "lora_alpha is [], not a number"}};
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    std::ofstream(path) << text;
    EXPECT_THAT([&] { models::check_peft_config(options, path); },
                ::testing::ThrowsMessage<std::invalid_argument>(
                    HasSubstr("model.lora_init_from: " + path + ": " + message)));
  }
  std::ofstream(path) << R"({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})";
  EXPECT_NO_THROW(models::check_peft_config(options, path));
}

INSTANTIATE_TEST_SUITE_P(Families, LoraPeft, ::testing::Range(0, kFamilyCount),
                         [](const auto& info) { return std::string(kFamilies[info.param].name); });

}  // namespace TRAINER_UNITY_ID
