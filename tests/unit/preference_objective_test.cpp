// The preference objectives (train/objective.h) against the papers' definitions over
// transformers + PEFT log-probabilities (tests/hf/preference_loss.py), on pairs of the preference
// sample tokenized with its chat template (scripts/tokenize_text.py --preference) and a random
// Llama: under LoRA with a PEFT adapter whose B is random (so that policy and reference differ),
// the first step's DPO loss (beta 0.1), cDPO's (label smoothing 0.1) and SimPO's (beta 2, gamma
// 0.5) equal Python's within 1e-4 relative, and so do DPO's adapter gradients (1e-4); in full
// fine-tuning with the precomputed reference (the initial weights' table) the loss and every
// weight's gradient too. The dataset's pair batches, the shards' checks (a preference objective
// on shards without pairs, pairs under train.objective: lm) are here as well.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "core/shape.h"
#include "data/errors.h"
#include "data/token_shards.h"
#include "io/safetensors.h"
#include "models/lm/causal_lm.h"
#include "models/lm/hf_ranges.h"
#include "models/registry.h"
#include "train/objective.h"

namespace TRAINER_UNITY_ID {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kVocab = 2048, kContext = 64, kPairs = 4;
const std::vector<std::string> kTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};

class Preference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string src = TRAINER_SOURCE_DIR;
    ready_ = test::run_python(src + "/scripts/tokenize_text.py",
                              fmt::format("--preference --tokenizer {0}/data/chat-sample/tokenizer/"
                                          "tokenizer.json --max-tokens {1} "
                                          "{0}/data/preference-sample/pairs.jsonl {2}",
                                          src, kContext, dir_->file("pairs")),
                              dir_->file("tokenize.log")) == 0 &&
             test::run_hf_script("hf_llama.py",
                                 fmt::format("make {} --vocab {} --layers 2 --heads 4 --kv-heads 2 "
                                             "--width 32 --intermediate 48 --positions {} --seed 5",
                                             dir_->file("base"), kVocab, 2 * kContext),
                                 *dir_) &&
             test::run_hf_script(
                 "lora_peft.py",
                 fmt::format("make {0}/base {0}/adapter {0}/base/expected.safetensors {0}/peft.st "
                             "--r 4 --alpha 8 --seed 3 --targets {1}",
                             dir_->path(), fmt::join(kTargets, " ")),
                 *dir_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << "the pairs, base or adapter were not made"; }

  static std::string shard() { return dir_->file("pairs") + "/train_000000.bin"; }
  static std::shared_ptr<models::CausalLm> model(bool lora) {
    models::ModelOptions o;
    o.name = "llama";
    o.preset = "llama-tiny";
    o.tie_embeddings = "auto";
    o.init_from = dir_->file("base");
    if (lora) {
      o.lora_rank = 4;
      o.lora_alpha = 8.0;
      o.lora_targets = kTargets;
      o.lora_init_from = dir_->file("adapter");
    }
    core::Shape s;
    s.vocab_size = kVocab;
    s.context = kContext;
    return std::dynamic_pointer_cast<models::CausalLm>(models::create_model(o, s));
  }
  static data::Batch pairs(const char* objective = "dpo") {
    const data::TokenShardDataset d({shard()}, kContext, kVocab, {}, data::Packing::kAuto,
                                    objective);
    return d.get(at::arange(kPairs, at::kLong));
  }
  // Python's loss, policy log-probabilities and gradients for `args`.
  static std::map<std::string, at::Tensor> python(const std::string& args, bool lora) {
    const std::string out = dir_->file("python.safetensors");
    EXPECT_TRUE(test::run_hf_script(
        "preference_loss.py",
        fmt::format("{} {} {} --pairs {} {}{}", dir_->file("base"), shard(), out, kPairs, args,
                    lora ? " --adapter " + dir_->file("adapter") : ""),
        *dir_));
    return io::read_safetensors(out);
  }

  static test::TempDir* dir_;
  static bool ready_;
};
test::TempDir* Preference::dir_ = nullptr;
bool Preference::ready_ = false;

train::TrainOptions options(train::ObjectiveKind kind, double smoothing = 0.0) {
  train::TrainOptions t;
  t.objective = kind;
  t.preference = {0.1, smoothing, 2.0, 0.5};
  return t;
}

double relative(double mine, double theirs) {
  return std::abs(mine - theirs) / std::max(std::abs(theirs), 1e-12);
}

// The loss against Python's (printed for the record), within 1e-4 relative.
void expect_loss(const char* what, double mine, const std::map<std::string, at::Tensor>& py) {
  const double theirs = py.at("loss").item<double>();
  fmt::print("{}: loss {:.8f}, Python {:.8f}, relative {:.2e}\n", what, mine, theirs,
             relative(mine, theirs));
  EXPECT_LT(relative(mine, theirs), 1e-4) << what;
}

// The adapters' gradients under PEFT's keys (base_model.model. + the Hugging Face name).
void expect_adapter_gradients(models::CausalLm& m, const std::map<std::string, at::Tensor>& py) {
  size_t compared = 0;
  double worst = 0;
  for (const auto& item : m.named_parameters()) {
    const std::string key = "base_model.model." + m.hf_prefix() + item.key();
    ASSERT_TRUE(py.count(key)) << key;
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double diff = test::max_abs_diff(item.value().grad(), py.at(key));
    EXPECT_LT(diff, 1e-4) << key;
    worst = std::max(worst, diff);
    ++compared;
  }
  fmt::print("LoRA DPO: {} adapter gradients, largest difference {:.2e}\n", compared, worst);
  EXPECT_EQ(compared + 2, py.size());  // every gradient, then loss and logps
  EXPECT_GT(compared, 0U);
}

TEST_F(Preference, PairBatchesHoldChosenThenRejectedWhole) {
  const data::Batch b = pairs();
  ASSERT_EQ(b.inputs.sizes(), (at::IntArrayRef{kPairs, 2, kContext}));
  ASSERT_TRUE(b.pairs.defined());
  EXPECT_TRUE(at::equal(b.pairs, at::arange(kPairs, at::kLong)));
  const data::TokenShardDataset d({shard()}, kContext, kVocab, {}, data::Packing::kAuto, "dpo");
  EXPECT_EQ(d.target_count(at::arange(3, at::kLong)), 3);  // one per pair
  // Each row counts some completion tokens, and the prompts (the rows' starts) are the targets'
  // complement: the first target of a row comes after its first position.
  const at::Tensor counted = b.targets.ne(core::kIgnoreTarget);
  EXPECT_TRUE(counted.sum(-1).gt(0).all().item<bool>());
  EXPECT_FALSE(counted.select(-1, 0).any().item<bool>());
}

TEST_F(Preference, ShardsWithoutPairsOrPairsUnderLmAreRefusedNamingTheKeyAndFile) {
  EXPECT_THAT(
      [&] { data::TokenShardDataset({shard()}, kContext, kVocab, {}, data::Packing::kAuto, ""); },
      ::testing::ThrowsMessage<data::DataError>(
          AllOf(HasSubstr(shard()), HasSubstr("set train.objective: dpo or simpo"))));
  // The same shard without its .pairs file: chat data, which dpo cannot train on.
  test::TempDir bare;
  for (const char* ext : {".bin", ".mask", ".docs"}) {
    std::filesystem::copy_file(dir_->file("pairs") + "/train_000000" + ext,
                               bare.file(std::string("train_000000") + ext));
  }
  const std::string chat = bare.file("train_000000.bin");
  EXPECT_THAT(
      [&] { data::TokenShardDataset({chat}, kContext, kVocab, {}, data::Packing::kAuto, "dpo"); },
      ::testing::ThrowsMessage<data::DataError>(AllOf(HasSubstr(chat),
                                                      HasSubstr("train.objective: dpo"),
                                                      HasSubstr(bare.file("train_000000.pairs")))));
  // A sequence longer than a row: named with its pair.
  EXPECT_THAT(
      [&] { data::TokenShardDataset({shard()}, 8, kVocab, {}, data::Packing::kAuto, "dpo"); },
      ::testing::ThrowsMessage<data::DataError>(
          AllOf(HasSubstr(shard()), HasSubstr("pair 0's chosen sequence"))));
}

TEST_F(Preference, LoraDpoLossAndGradientsEqualPeft) {
  const auto py = python("--objective dpo --beta 0.1", true);
  auto m = model(true);
  m->eval();
  const train::Objective objective(options(train::ObjectiveKind::kDpo), *m);
  ASSERT_EQ(objective.reference(), train::ReferenceKind::kAdaptersOff);
  const at::Tensor sums = at::zeros({objective.metrics()}, at::kDouble);
  const at::Tensor loss = objective.loss(pairs(), &sums, 1.0 / kPairs);
  loss.backward();
  expect_loss("LoRA DPO", loss.item<double>(), py);
  // Policy and reference differ (the adapter's B is random): the loss is not log 2.
  EXPECT_GT(std::abs(loss.item<double>() - std::log(2.0)), 1e-3);
  // logps/chosen and logps/rejected: the means of Python's policy log-probabilities.
  const at::Tensor logps = py.at("logps").mean(0);
  EXPECT_LT(relative(sums[4].item<double>(), logps[0].item<double>()), 1e-4);
  EXPECT_LT(relative(sums[5].item<double>(), logps[1].item<double>()), 1e-4);
  expect_adapter_gradients(*m, py);
}

TEST_F(Preference, CdpoAndSimpoLossesEqualPython) {
  auto m = model(true);
  m->eval();
  const at::NoGradGuard no_grad;
  for (const auto& [kind, args] :
       {std::pair{train::ObjectiveKind::kDpo, "--objective dpo --beta 0.1 --label-smoothing 0.1"},
        std::pair{train::ObjectiveKind::kSimpo, "--objective simpo --beta 2 --gamma 0.5"}}) {
    SCOPED_TRACE(args);
    const auto py = python(args, true);
    const train::Objective objective(options(kind, 0.1), *m);
    expect_loss(args, objective.loss(pairs()).item<double>(), py);
  }
}

TEST_F(Preference, FullFineTuningDpoWithThePrecomputedReferenceEqualsPyTorch) {
  const auto py = python("--objective dpo --beta 0.1", false);
  auto m = model(false);
  m->eval();
  train::Objective objective(options(train::ObjectiveKind::kDpo), *m);
  ASSERT_EQ(objective.reference(), train::ReferenceKind::kPrecomputed);
  const data::Batch b = pairs();
  // The initial weights' table, by pair index (what train/reference_logps.h computes).
  at::Tensor table = at::zeros({kPairs + 3, 2}, at::kDouble);
  table.narrow(0, 0, kPairs).copy_(objective.pair_logps(b));
  EXPECT_LT(test::max_abs_diff(table.narrow(0, 0, kPairs), py.at("logps")), 1e-4);
  objective.set_reference(table, {});
  const at::Tensor loss = objective.loss(b);
  loss.backward();
  expect_loss("full DPO", loss.item<double>(), py);
  const models::ParameterShapes shapes = models::parameter_shapes(*m);
  auto params = m->named_parameters();
  size_t compared = 0;
  double worst = 0;
  for (const models::HfTensor& e : m->hf_map(shapes)) {
    if (e.check_only) continue;
    ASSERT_TRUE(py.count(e.name)) << e.name;
    const at::Tensor mine = params[e.param].grad().narrow(0, e.row_begin, e.rows);
    ASSERT_EQ(mine.sizes(), py.at(e.name).sizes()) << e.name;
    const double diff = test::max_abs_diff(mine, py.at(e.name));
    EXPECT_LT(diff, 1e-4) << e.name;
    worst = std::max(worst, diff);
    ++compared;
  }
  EXPECT_EQ(compared + 2, py.size());
  fmt::print("full DPO: {} gradients, largest difference {:.2e}\n", compared, worst);
}

}  // namespace TRAINER_UNITY_ID
