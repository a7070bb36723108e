// A preference objective's pair is one sample (docs/DESIGN.md, "Preference objectives"): W ranks
// with micro-batches of 2 pairs equal one process with the whole global batch in one micro-batch,
// the loss being the mean over the global batch's pairs. After 3 steps of DPO the parameters match
// to 1e-5 (the noise floor of changing the world size), and so do the step's metrics (TRL's
// rewards/* and logps/*) and the validation's, under ddp.shard none and parameters, with LoRA
// (the reference: the base with the adapters off) and in full fine-tuning (the reference
// precomputed before step 1, train/reference_logps.h); SimPO under none.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/chat_shards.h"
#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "train/evaluation.h"
#include "train/reference_logps.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

// Pairs sharing a prompt of 3 to 9 tokens (mask 0), each answer 1 to 14 tokens (mask 1); ids
// below 100; context 24 holds every sequence.
void write_pairs(const std::string& base, uint64_t seed, int pairs) {
  std::vector<test::Doc> docs;
  uint64_t x = seed;
  const auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int p = 0; p < pairs; ++p) {
    test::Doc prompt;
    for (uint64_t i = 0, n = 3 + next() % 7; i < n; ++i) {
      prompt.tokens.push_back(static_cast<uint16_t>(next() % 100));
      prompt.mask.push_back(0);
    }
    for (int side = 0; side < 2; ++side) {
      test::Doc d = prompt;
      for (uint64_t i = 0, n = 1 + next() % 14; i < n; ++i) {
        d.tokens.push_back(static_cast<uint16_t>(next() % 100));
        d.mask.push_back(1);
      }
      docs.push_back(std::move(d));
    }
  }
  test::write_chat_shard(base, docs);
  test::write_bytes(base + ".pairs", test::header("TRAINPAR", static_cast<uint64_t>(pairs)));
}

struct Run {
  std::vector<at::Tensor> parameters, initial;
  train::StepResult last;
  train::ValidationMetrics validation;
};

Run train_on(ddp::Communicator& comm, const std::string& yaml) {
  trainer_test::CpuRun cpu = trainer_test::make_cpu_run(comm, yaml, "preference.yaml");
  train::Trainer& trainer = *cpu.trainer;
  Run run;
  {
    const auto pinned = trainer_test::pin_parameters(trainer);
    run.initial = trainer_test::snapshot(*cpu.model);
  }
  train::prepare_reference(trainer, "", "");
  for (int64_t s = 1; s <= trainer.options().train.steps; ++s) run.last = trainer.step(s);
  const auto pinned = trainer_test::pin_parameters(trainer);
  run.parameters = trainer_test::snapshot(*cpu.model);
  run.validation = train::evaluate_validation(comm, *cpu.model, *cpu.dataset->validation(), 3, 0,
                                              {}, &trainer.objective());
  return run;
}

void expect_near_all(const std::vector<std::pair<std::string, double>>& a,
                     const std::vector<std::pair<std::string, double>>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_NEAR(a[i].second, b[i].second, 1e-5 * std::max(1.0, std::abs(b[i].second)))
        << what << " " << a[i].first;
  }
}

void expect_world_matches_self(const std::string& model, const std::string& shard,
                               const std::string& objective) {
  test::TempDir dir;  // each rank writes the same files into its own directory
  write_pairs(dir.file("train_000"), 1, 30);
  write_pairs(dir.file("val_000"), 2, 5);
  const std::string data =
      "data: {dataset: tokens, path: " + dir.path() + ", context: 24, vocab_size: 100}\n";
  const std::string train = fmt::format(
      "train: {{device: cpu, global_batch_size: 6, micro_batch_size: 2, steps: 3, lr: 0.01, "
      "warmup_steps: 1, seed: 5, objective: {}, dpo_beta: 0.5}}\n",
      objective);
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const Run distributed = train_on(*world, model + data + train + "ddp: {shard: " + shard + "}\n");
  std::string self_train = train;  // one micro-batch of the whole global batch
  self_train.replace(self_train.find("micro_batch_size: 2"), 19, "micro_batch_size: 6");
  const Run reference = train_on(*self, model + data + self_train);
  const double err = relative_error(distributed.parameters, reference.parameters);
  EXPECT_LT(err, 1e-5) << "world " << world->size() << ", ddp.shard " << shard;
  EXPECT_GT(relative_error(reference.parameters, reference.initial), 1e-3) << "nothing trained";
  EXPECT_NEAR(distributed.last.loss, reference.last.loss, 1e-5 * reference.last.loss);
  ASSERT_EQ(reference.last.objective.size(), 6U);
  EXPECT_EQ(reference.last.objective[0].first, "rewards/chosen");
  expect_near_all(distributed.last.objective, reference.last.objective, "step metrics");
  ASSERT_EQ(reference.validation.means.size(), 7U);  // loss and the six metrics
  expect_near_all(distributed.validation.means, reference.validation.means, "validation");
  if (world->rank() == 0) {
    fmt::print("world {}, ddp.shard {}, {}: parameters {:.2e}; loss {:.6f}, validation loss "
               "{:.6f}\n",
               world->size(), shard, objective, err, distributed.last.loss,
               distributed.validation.means[0].second);
  }
}

// A tied Llama (its embeddings' unit entered twice per forward), and one with LoRA adapters: B
// starts at zero, so the first step's policy is the reference; the steps after it see them differ.
const char* kTied =
    "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 32, heads: 4, kv_heads: 2, "
    "intermediate_size: 48, tie_embeddings: true}\n";
const char* kAdapters =
    "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 32, heads: 4, kv_heads: 2, "
    "intermediate_size: 48, lora_rank: 2, lora_alpha: 4, "
    "lora_targets: [q_proj, k_proj, o_proj, up_proj]}\n";

// Each model under both modes (the reference off the adapters, or precomputed), and SimPO.
struct Case {
  const char* name;
  const char* model;
  const char* shard;
  const char* objective;
};
class PreferenceEquivalence : public ::testing::TestWithParam<Case> {};
TEST_P(PreferenceEquivalence, WorldEqualsOneProcess) {
  expect_world_matches_self(GetParam().model, GetParam().shard, GetParam().objective);
}
INSTANTIATE_TEST_SUITE_P(
    Objectives, PreferenceEquivalence,
    ::testing::Values(Case{"DpoAdaptersNone", kAdapters, "none", "dpo"},
                      Case{"DpoAdaptersParameters", kAdapters, "parameters", "dpo"},
                      Case{"DpoEveryWeightNone", kTied, "none", "dpo"},
                      Case{"DpoEveryWeightParameters", kTied, "parameters", "dpo"},
                      Case{"SimpoAdaptersNone", kAdapters, "none", "simpo"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace TRAINER_UNITY_ID
