// Muon (train.optimizer: muon, train/muon.h): the owner plan, which matrices it takes, and the
// update against PyTorch's: torch.optim.Muon over the hidden matrices plus torch.optim.AdamW over
// the rest (tests/reference/muon.py), stepped with the very gradients the trainer's optimizer
// received, in fp32, within 1e-5 after 3 steps: gpt over its own parameters, llama and qwen3 over
// a transformers model's (q_proj, k_proj and v_proj each a matrix, not the fused qkv_proj). The
// N-rank runs, every sharding mode, resume and the Newton-Schulz count: tests/mpi/muon_test.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "common/hf_scripts.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "fake_communicator.h"
#include "models/capabilities.h"
#include "models/lm/causal_lm.h"
#include "models/lm/hf_ranges.h"
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
  std::vector<train::MuonTarget> hidden;
  std::vector<int64_t> sizes;
  for (int b = 0; b < 8; ++b) {
    for (const auto& shape :
         std::vector<std::vector<int64_t>>{{192, 64}, {64, 64}, {256, 64}, {64, 256}, {64}}) {
      shapes.emplace_back(fmt::format("h.{}.w{}", b, shapes.size()), shape);
      if (shape.size() == 2)
        hidden.push_back({shapes.back().first, shapes.size() - 1, 0, shape[0]});
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
  EXPECT_THROW(train::plan_muon(layout_of({64}, 1), shapes, {{"w", 0, 0, 4}}, 2, 5),
               std::invalid_argument);
}

// A fused [q; k; v] of 12 + 4 + 4 rows of 8: three matrices, each its rows' elements, with its
// own Newton-Schulz cost.
TEST(MuonPlan, RowRangesOfAParameterAreMatricesOfTheirOwn) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"b", {8}},
                                                                            {"qkv", {20, 8}}};
  const std::vector<train::MuonTarget> targets = {
      {"q", 1, 0, 12}, {"k", 1, 12, 4}, {"v", 1, 16, 4}};
  const MuonPlan plan = train::plan_muon(layout_of({8, 160}, 2), shapes, targets, 2, 5);
  ASSERT_EQ(plan.matrices.size(), 3u);
  for (const auto& m : plan.matrices) {
    const int64_t row = m.name == "q" ? 0 : m.name == "k" ? 12 : 16;
    EXPECT_EQ(m.param, 1u) << m.name;
    EXPECT_EQ(m.begin, row * 8) << m.name;
    EXPECT_EQ(m.rows, m.name == "q" ? 12 : 4) << m.name;
    EXPECT_EQ(m.cols, 8) << m.name;
    EXPECT_EQ(m.flops, train::newton_schulz_flops(m.rows, 8, 5)) << m.name;
  }
  EXPECT_EQ(plan.matrices[0].name, "q");  // the largest first, to rank 0
  EXPECT_EQ(plan.matrices[0].owner, 0);
  EXPECT_EQ(plan.flops_of(1), 2 * train::newton_schulz_flops(4, 8, 5));
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

// 3 steps of a model here, with each step's gradients as the optimizer received them and the
// metadata tests/reference/muon.py takes (kTrain's hyperparameters, each step's learning rates).
struct Recorded {
  test::TempDir dir;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<data::Dataset> dataset;
  trainer_test::FakeCommunicator control, data;
  std::unique_ptr<train::Trainer> trainer;
  std::map<std::string, at::Tensor> init;                // by parameter name
  std::vector<std::map<std::string, at::Tensor>> grads;  // per step, by parameter name
  std::map<std::string, std::string> meta;
  std::map<std::string, size_t> index;  // named_parameters() order
};

void record_three_steps(Recorded& r, const std::string& model_yaml) {
  write_tokens(r.dir.path() + "/train_000.bin", 4000);
  const auto config =
      config::parse_config(model_yaml + "data: {dataset: tokens, path: " + r.dir.path() +
                               ", context: 16, vocab_size: 100, workers: 0}\n" + kTrain,
                           "muon-reference.yaml");
  r.dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  r.model = models::create_model(config.model, r.dataset->shape());
  r.meta = {{"steps", "3"},
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
  const auto named = r.model->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    r.init[named[i].key()] = named[i].value().detach().clone();
    r.index[named[i].key()] = i;
  }
  r.trainer = std::make_unique<train::Trainer>(config.trainer_options(), r.control, r.data, r.model,
                                               *r.dataset, c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= 3; ++s) {
    const train::StepResult step = r.trainer->step(s);
    r.meta[fmt::format("adamw_lr.{}", s)] = fmt::format("{:.17g}", step.lr);
    r.meta[fmt::format("muon_lr.{}", s)] = fmt::format("{:.17g}", step.lr / 0.01 * 0.02);
    auto& grads = r.grads.emplace_back();
    for (const auto& item : named) grads[item.key()] = item.value().grad().detach().clone();
  }
}

// Ours against the reference's `key`, relative per tensor: below 1e-5.
double expect_close(const at::Tensor& ours, const std::map<std::string, at::Tensor>& ref,
                    const std::string& key) {
  if (!ref.count(key)) {
    ADD_FAILURE() << "the reference has no " << key;
    return 1.0;
  }
  const double err = test::relative_error(ours.detach(), ref.at(key));
  EXPECT_LT(err, 1e-5) << key;
  return err;
}

// Runs 3 steps' gradients through PyTorch's optimizers from the same start, over the trainer's
// own parameters; expects the parameters, the momentum and AdamW's moments to match to 1e-5
// (relative, per tensor).
void expect_matches_torch(const std::string& model_yaml) {
  Recorded r;
  record_three_steps(r, model_yaml);
  const auto hidden = models::hidden_parameters(*models::as<models::HiddenMatrices>(*r.model));
  std::map<std::string, at::Tensor> in;
  for (const auto& [name, t] : r.init) in["init." + name] = t;
  for (size_t s = 0; s < r.grads.size(); ++s) {
    for (const auto& [name, g] : r.grads[s]) in[fmt::format("grad.{}.{}", s + 1, name)] = g;
  }
  r.meta["muon"] = fmt::format("{}", fmt::join(hidden, ","));
  const auto ref = test::run_reference("muon.py", in, r.meta);
  ASSERT_FALSE(ref.empty());
  const std::set<std::string> muon(hidden.begin(), hidden.end());
  const auto named = r.model->named_parameters();
  const auto& opt = r.trainer->optimizer();
  double worst = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].key();
    worst = std::max(worst, expect_close(named[i].value(), ref, "param." + name));
    if (muon.count(name)) {
      worst = std::max(worst, expect_close(opt.exp_avgs()[i], ref, "momentum." + name));
    } else {
      worst = std::max(worst, expect_close(opt.exp_avgs()[i], ref, "exp_avg." + name));
      worst = std::max(worst, expect_close(opt.exp_avg_sqs()[i], ref, "exp_avg_sq." + name));
    }
    // Muon moved its matrices: the update is not AdamW's.
    EXPECT_GT(test::relative_error(named[i].value().detach(), r.init.at(name)), 1e-4) << name;
  }
  EXPECT_EQ(trainer_test::muon_newton_schulz_calls(*r.trainer),
            3 * static_cast<int64_t>(hidden.size()));
  std::printf("muon vs torch.optim.Muon + AdamW: worst relative error %.1e over %zu tensors\n",
              worst, named.size());
}

// GPT-2's c_attn is one matrix in Hugging Face's files too (its Conv1D weights are stored
// transposed there; Muon's rate scale takes the trainer's [out, in]).
TEST(MuonReference, GptMatchesTorchAfterThreeSteps) {
  expect_matches_torch("model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n");
}

// A random transformers model of `family` (tests/hf/hf_llama.py make `args`), trained here 3
// steps from it (model.init_from); then the same gradients, as Hugging Face's tensors, through
// torch.optim.Muon over that model's layers' 2-D weights (q_proj, k_proj and v_proj each its
// own matrix) plus torch.optim.AdamW over the rest: every tensor of the files, its parameters,
// momentum or moments, equals ours (as rows of our parameters: the family's hf_map) to 1e-5.
void expect_matches_torch_over_hf_layout(const std::string& family, const std::string& args,
                                         int64_t matrices) {
  test::TempDir hf;
  ASSERT_TRUE(test::run_hf_script(
      "hf_llama.py", fmt::format("make {} --vocab 100 --positions 32 --untied {}", hf.path(), args),
      hf));
  Recorded r;
  record_three_steps(r, "model: {name: " + family + ", init_from: " + hf.path() + "}\n");
  auto* lm = dynamic_cast<models::CausalLm*>(r.model.get());
  ASSERT_NE(lm, nullptr);
  const models::ParameterShapes shapes = models::parameter_shapes(*lm);
  std::vector<models::HfTensor> tensors;
  for (const models::HfTensor& e : lm->hf_map(shapes)) {
    if (!e.check_only) tensors.push_back(e);
  }
  const auto rows = [](const at::Tensor& t, const models::HfTensor& e) {
    return t.narrow(0, e.row_begin, e.rows);
  };
  std::map<std::string, at::Tensor> in;
  for (size_t s = 0; s < r.grads.size(); ++s) {
    for (const auto& e : tensors)
      in[fmt::format("grad.{}.{}", s + 1, e.name)] = rows(r.grads[s][e.param], e);
  }
  r.meta["hf_model"] = hf.path();
  const auto ref = test::run_reference("muon.py", in, r.meta);
  ASSERT_FALSE(ref.empty());
  const train::MuonTargets targets = train::muon_targets(*r.model);
  const auto& opt = r.trainer->optimizer();
  auto params = r.model->named_parameters();
  double worst = 0;
  for (const auto& e : tensors) {
    const size_t i = r.index.at(e.param);
    worst = std::max(worst, expect_close(rows(params[e.param], e), ref, "param." + e.name));
    if (targets.params[i]) {  // Muon's here: the reference's Muon matrix too
      worst = std::max(worst, expect_close(rows(opt.exp_avgs()[i], e), ref, "momentum." + e.name));
    } else {
      worst = std::max(worst, expect_close(rows(opt.exp_avgs()[i], e), ref, "exp_avg." + e.name));
      worst =
          std::max(worst, expect_close(rows(opt.exp_avg_sqs()[i], e), ref, "exp_avg_sq." + e.name));
    }
  }
  EXPECT_EQ(ref.size(), 2 * tensors.size() + (tensors.size() - targets.matrices.size()));
  EXPECT_EQ(trainer_test::muon_newton_schulz_calls(*r.trainer), 3 * matrices);
  std::printf("muon (%s) vs torch.optim.Muon + AdamW over Hugging Face's tensors: worst relative "
              "error %.1e over %zu tensors\n",
              family.c_str(), worst, tensors.size());
}

// 2 layers x 7 matrices (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
TEST(MuonReference, LlamaMatchesTorchOverHuggingFacesLayoutAfterThreeSteps) {
  expect_matches_torch_over_hf_layout(
      "llama", "--layers 2 --heads 6 --kv-heads 2 --width 36 --intermediate 40 --seed 5", 14);
}

// Qwen3's q and k norms (AdamW's) and a head_dim other than width / heads.
TEST(MuonReference, Qwen3MatchesTorchOverHuggingFacesLayoutAfterThreeSteps) {
  expect_matches_torch_over_hf_layout("qwen3",
                                      "--model-type qwen3 --layers 2 --heads 4 --kv-heads 2 "
                                      "--width 32 --head-dim 12 --intermediate 40 --seed 6",
                                      14);
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
    const auto hidden = models::hidden_parameters(*models::as<models::HiddenMatrices>(*model));
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
    // As Hugging Face stores them: llama's fused qkv_proj is q_proj, k_proj and v_proj; every
    // other matrix (GPT-2's c_attn too) a whole parameter under its own name.
    const auto matrices = models::as<models::HiddenMatrices>(*model)->hidden_matrices();
    const auto params = model->named_parameters();
    size_t fused = 0;
    for (const auto& m : matrices) {
      if (m.param.ends_with(".qkv_proj.weight")) {
        const std::string prefix = m.param.substr(0, m.param.size() - 16);
        EXPECT_TRUE(m.name == prefix + ".q_proj.weight" || m.name == prefix + ".k_proj.weight" ||
                    m.name == prefix + ".v_proj.weight")
            << m.name;
        fused += m.name.ends_with(".q_proj.weight");
      } else {
        EXPECT_EQ(m.name, m.param);
        EXPECT_EQ(m.row_begin, 0) << m.name;
        EXPECT_EQ(m.rows, params[m.param].size(0)) << m.name;
      }
    }
    EXPECT_EQ(fused > 0, name == "llama");
    EXPECT_EQ(matrices.size(), hidden.size() + 2 * fused) << name;
  }
}

}  // namespace TRAINER_UNITY_ID
