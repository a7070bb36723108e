// Muon (train.optimizer: muon, train/muon.h): the owner plan, which parameters it takes, and the
// update against PyTorch's: torch.optim.Muon over the hidden matrices plus torch.optim.AdamW over
// the rest (tests/reference/muon.py), stepped with the very gradients the trainer's optimizer
// received, on gpt and llama in fp32, within 1e-5 after 3 steps. The N-rank runs, every sharding
// mode, resume and the Newton-Schulz count: tests/mpi/muon_test.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "fake_communicator.h"
#include "models/capabilities.h"
#include "models/registry.h"
#include "reference_harness.h"
#include "train/muon.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using train::MuonPlan;

// A bucket layout of `sizes` parameters (numel) in buckets of `per_bucket`.
std::vector<ddp::BucketLayout> layout_of(const std::vector<int64_t>& sizes, size_t per_bucket) {
  std::vector<ddp::BucketLayout> layout;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (k % per_bucket == 0) layout.emplace_back();
    layout.back().params.push_back(k);
    layout.back().offsets.push_back(layout.back().numel);
    layout.back().numel += sizes[k];
  }
  return layout;
}

TEST(MuonPlan, EachMatrixHasOneOwnerAndTheOwnersBalanceFlops) {
  // Eight blocks of a 64-wide transformer: attention 192x64, 64x64, MLP 256x64, 64x256, and a
  // bias (1-D) each.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  std::vector<bool> hidden;
  std::vector<int64_t> sizes;
  for (int b = 0; b < 8; ++b) {
    for (const auto& shape :
         std::vector<std::vector<int64_t>>{{192, 64}, {64, 64}, {256, 64}, {64, 256}, {64}}) {
      shapes.emplace_back(fmt::format("h.{}.w{}", b, shapes.size()), shape);
      hidden.push_back(shape.size() == 2);
      sizes.push_back(shape.size() == 2 ? shape[0] * shape[1] : shape[0]);
    }
  }
  for (const int world : {1, 2, 3, 5}) {
    const MuonPlan plan = train::plan_muon(layout_of(sizes, 5), shapes, hidden, world, 5);
    ASSERT_EQ(plan.matrices.size(), 32u);
    EXPECT_EQ(plan.chunks.size(), 8u);
    double total = 0, most = 0;
    for (int r = 0; r < world; ++r) {
      total += plan.flops_of(r);
      most = std::max(most, plan.flops_of(r));
    }
    // No rank carries much more than its share (the largest matrix bounds the imbalance).
    EXPECT_LE(most, total / world + train::newton_schulz_flops(256, 64, 5)) << world;
    for (const auto& chunk : plan.chunks) {  // each owner's matrices lie apart in its block
      std::map<int, int64_t> filled;
      for (const size_t i : chunk.matrices) {
        const auto& m = plan.matrices[i];
        EXPECT_EQ(m.slot, filled[m.owner]);
        filled[m.owner] += m.numel();
        EXPECT_LE(filled[m.owner], chunk.block);
      }
    }
  }
}

TEST(MuonPlan, RefusesAMatrixThatIsNot2D) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"w", {4, 4, 4}}};
  EXPECT_THROW(train::plan_muon(layout_of({64}, 1), shapes, {true}, 2, 5), std::invalid_argument);
}

// A token shard of `n` uint16 ids below 97.
void write_tokens(const std::string& path, int64_t n) {
  const at::Tensor tokens = (at::arange(n, at::kLong) * 7919 % 97).to(at::kShort);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(tokens.data_ptr(), 2, n, f);
  std::fclose(f);
}

constexpr const char* kTrain =
    "train: {device: cpu, global_batch_size: 8, micro_batch_size: 4, steps: 3, lr: 0.01, "
    "warmup_steps: 1, grad_clip: 1.0, seed: 3, weight_decay: 0.1, beta2: 0.95, optimizer: muon, "
    "muon_lr: 0.02, muon_weight_decay: 0.05, threads: 1}\n"
    "memory: {check_every: 0}\n";

// Trains 3 steps of `model_yaml` here, recording each step's gradients as the optimizer received
// them, then runs them through PyTorch's optimizers from the same start; expects the parameters,
// the momentum and AdamW's moments to match to 1e-5 (relative, per tensor).
void expect_matches_torch(const std::string& model_yaml) {
  test::TempDir dir;
  write_tokens(dir.path() + "/train_000.bin", 4000);
  const auto config =
      config::parse_config(model_yaml + "data: {dataset: tokens, path: " + dir.path() +
                               ", context: 16, vocab_size: 100, workers: 0}\n" + kTrain,
                           "muon-reference.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  std::map<std::string, at::Tensor> in;
  std::map<std::string, std::string> meta = {{"steps", "3"},
                                             {"beta1", "0.9"},
                                             {"beta2", "0.95"},
                                             {"eps", "1e-08"},
                                             {"weight_decay", "0.1"},
                                             {"muon_weight_decay", "0.05"},
                                             {"momentum", "0.95"},
                                             {"nesterov", "true"},
                                             {"ns_steps", "5"},
                                             {"adjust_lr_fn", "original"},
                                             {"threads", std::to_string(at::get_num_threads())}};
  const auto hidden = models::as<models::HiddenMatrices>(*model)->hidden_matrices();
  meta["muon"] = fmt::format("{}", fmt::join(hidden, ","));
  for (const auto& item : model->named_parameters()) {
    in["init." + item.key()] = item.value().detach().clone();
  }
  trainer_test::FakeCommunicator control, data;
  train::Trainer trainer(config.trainer_options(), control, data, model, *dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= 3; ++s) {
    const train::StepResult r = trainer.step(s);
    meta[fmt::format("adamw_lr.{}", s)] = fmt::format("{:.17g}", r.lr);
    meta[fmt::format("muon_lr.{}", s)] = fmt::format("{:.17g}", r.lr / 0.01 * 0.02);
    for (const auto& item : model->named_parameters()) {
      in[fmt::format("grad.{}.{}", s, item.key())] = item.value().grad().detach().clone();
    }
  }
  const auto ref = test::run_reference("muon.py", in, meta);
  ASSERT_FALSE(ref.empty());
  const std::set<std::string> muon(hidden.begin(), hidden.end());
  const auto named = model->named_parameters();
  double worst = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].key();
    std::vector<std::pair<std::string, at::Tensor>> ours = {{"param." + name, named[i].value()}};
    if (muon.count(name)) {
      ours.emplace_back("momentum." + name, trainer.optimizer().exp_avgs()[i]);
    } else {
      ours.emplace_back("exp_avg." + name, trainer.optimizer().exp_avgs()[i]);
      ours.emplace_back("exp_avg_sq." + name, trainer.optimizer().exp_avg_sqs()[i]);
    }
    for (const auto& [key, t] : ours) {
      ASSERT_TRUE(ref.count(key)) << key;
      const double err = test::relative_error(t.detach(), ref.at(key));
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-5) << key;
    }
    // Muon moved its matrices: the update is not AdamW's.
    EXPECT_GT(test::relative_error(named[i].value().detach(), in.at("init." + name)), 1e-4) << name;
  }
  EXPECT_EQ(trainer_test::muon_newton_schulz_calls(trainer),
            3 * static_cast<int64_t>(hidden.size()));
  std::printf("muon vs torch.optim.Muon + AdamW: worst relative error %.1e over %zu tensors\n",
              worst, named.size());
}

TEST(MuonReference, GptMatchesTorchAfterThreeSteps) {
  expect_matches_torch("model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n");
}

TEST(MuonReference, LlamaMatchesTorchAfterThreeSteps) {
  expect_matches_torch(
      "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 36, heads: 6, "
      "kv_heads: 2, intermediate_size: 40, tie_embeddings: false}\n");
}

TEST(MuonMatrices, AreTheBlocksTwoDimensionalWeights) {
  test::TempDir dir;
  write_tokens(dir.path() + "/train_000.bin", 4000);
  for (const std::string name : {"gpt", "llama"}) {
    const auto config = config::parse_config(
        "model: {name: " + name + ", preset: " + (name == "gpt" ? "tiny" : "llama-tiny") +
            "}\ndata: {dataset: tokens, path: " + dir.path() +
            ", context: 16, vocab_size: 100}\ntrain: {global_batch_size: 8}\n",
        "m.yaml");
    const auto dataset = data::make_dataset(config.data);
    auto model = models::create_model(config.model, dataset->shape());
    const auto hidden = models::as<models::HiddenMatrices>(*model)->hidden_matrices();
    const std::set<std::string> set(hidden.begin(), hidden.end());
    int64_t blocks2d = 0;
    for (const auto& item : model->named_parameters()) {
      const bool in_block = item.key().starts_with("h.") || item.key().starts_with("layers.");
      const bool matrix = in_block && item.value().dim() == 2;
      blocks2d += matrix;
      EXPECT_EQ(set.count(item.key()) > 0, matrix) << name << ": " << item.key();
    }
    EXPECT_EQ(blocks2d, static_cast<int64_t>(hidden.size()));
    EXPECT_GT(blocks2d, 0);
  }
}

}  // namespace TRAINER_UNITY_ID
