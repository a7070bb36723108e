// The N-rank vs 1-rank equivalence of every model from its file format (issue: models and data):
// gpt on token shards, the sequence forecaster (lstm and transformer) on a CSV series, the CNN on
// PNG crops. After a few optimizer steps with an uneven global batch and gradient accumulation,
// parameters trained on W ranks equal those trained by one process (MPI_COMM_SELF) to 1e-5, step
// 1's reduced gradients and their norm to 1e-6, and the validation metrics computed across ranks
// equal the single process's.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "models/registry.h"
#include "train/evaluation.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

struct Run {
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> initial;
  std::vector<at::Tensor> step1_grads;  // the reduced gradients after step 1 (clipped)
  std::vector<at::Tensor> frozen;       // the buffers after the last step (LoRA: the base)
  std::vector<at::Tensor> frozen_initial;
  double step1_grad_norm = 0;  // their global norm before clipping
  train::ValidationMetrics validation;
};

Run train_on(ddp::Communicator& comm, const std::string& yaml) {
  const auto config = config::parse_config(yaml, "model-equivalence.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  Run run;
  for (const auto& p : model->parameters()) run.initial.push_back(p.detach().clone());
  for (const auto& b : model->buffers()) run.frozen_initial.push_back(b.detach().clone());
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= config.train.steps; ++s) {
    const train::StepResult r = trainer.step(s);
    if (s > 1) continue;
    run.step1_grad_norm = r.grad_norm;
    // Under ddp.shard optimizer and above a rank holds only its shard's reduced gradients.
    if (config.ddp.shard != ddp::ShardMode::kNone) continue;
    for (const auto& p : model->parameters()) run.step1_grads.push_back(p.grad().detach().clone());
  }
  const auto pinned =
      trainer_test::pin_parameters(trainer);  // ddp.shard: parameters: every unit whole
  for (const auto& p : model->parameters()) run.parameters.push_back(p.detach().clone());
  for (const auto& b : model->buffers()) run.frozen.push_back(b.detach().clone());
  const auto validation = dataset->validation();
  if (validation) run.validation = train::evaluate_validation(comm, *model, *validation, 3, 0);
  return run;
}

// `tolerance` for the parameters after the last step and the validation metrics,
// `grad_tolerance` for step 1's gradients and their norm (AdamW's update hardly changes when every
// gradient is off by a constant factor, a wrong mean over ranks; the gradients do).
void expect_world_matches_self(const std::string& yaml, double tolerance = 1e-5,
                               double grad_tolerance = 1e-6) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const Run distributed = train_on(*world, yaml);
  const Run reference = train_on(*self, yaml);
  ASSERT_EQ(distributed.parameters.size(), reference.parameters.size());
  // Sharded: the gradients' global norm (below) stands for them.
  const double grad_err = distributed.step1_grads.empty()
                              ? 0.0
                              : relative_error(distributed.step1_grads, reference.step1_grads);
  EXPECT_LT(grad_err, grad_tolerance) << "step 1 gradients, world " << world->size();
  EXPECT_GT(reference.step1_grad_norm, 0);
  EXPECT_NEAR(distributed.step1_grad_norm, reference.step1_grad_norm,
              grad_tolerance * reference.step1_grad_norm);
  const double err = relative_error(distributed.parameters, reference.parameters);
  EXPECT_LT(err, tolerance) << "world " << world->size();
  EXPECT_GT(relative_error(reference.parameters, reference.initial), 1e-3)
      << "training moved nothing";
  // Buffers (LoRA's frozen base) do not train: bitwise as they started, on every rank.
  ASSERT_EQ(distributed.frozen.size(), distributed.frozen_initial.size());
  for (size_t i = 0; i < distributed.frozen.size(); ++i) {
    EXPECT_TRUE(at::equal(distributed.frozen[i], distributed.frozen_initial[i])) << "buffer " << i;
  }
  ASSERT_EQ(distributed.validation.means.size(), reference.validation.means.size());
  EXPECT_EQ(distributed.validation.samples, reference.validation.samples);
  EXPECT_GT(reference.validation.samples, 0);
  for (size_t i = 0; i < reference.validation.means.size(); ++i) {
    const auto& [name, value] = reference.validation.means[i];
    EXPECT_NEAR(distributed.validation.means[i].second, value, tolerance * std::abs(value) + 1e-9)
        << name;
  }
  if (world->rank() == 0) {
    fmt::print("world {}: step 1 gradients relative error {:.2e} (norm {:.6g}), parameters {:.2e}; "
               "validation",
               world->size(), grad_err, distributed.step1_grad_norm, err);
    for (const auto& [name, value] : distributed.validation.means)
      fmt::print(" {} {:.6f}", name, value);
    fmt::print(" over {} samples\n", distributed.validation.samples);
  }
}

// Seven samples per step: uneven over 2 and 3 ranks; micro-batches of 2 accumulate.
const char* kTrain = "train: {device: cpu, global_batch_size: 7, micro_batch_size: 2, steps: 5, "
                     "lr: 0.003, warmup_steps: 1, seed: 11}\n";

// train_000.bin and val_000.bin: uint16 ids below 97 in a fixed pattern.
void write_token_shards(const test::TempDir& dir) {
  for (const char* name : {"train_000.bin", "val_000.bin"}) {
    const int64_t n = std::string(name) == "val_000.bin" ? 700 : 6000;
    const at::Tensor tokens = (at::arange(n, at::kLong) * 7919 % 97).to(at::kShort);
    FILE* f = std::fopen((dir.path() + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(tokens.data_ptr(), 2, n, f);
    std::fclose(f);
  }
}

TEST(ModelEquivalence, GptOnTokenShards) {
  test::TempDir dir;  // each rank writes the same files into its own directory
  write_token_shards(dir);
  expect_world_matches_self(
      "model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n"
      "data: {dataset: tokens, path: " +
      dir.path() + ", context: 16, vocab_size: 100, workers: 2}\n" + kTrain);
}

// llama: grouped-query attention (6 heads over 2 kv heads of 6), rotary with the llama3 scaling,
// SwiGLU, an untied output layer.
TEST(ModelEquivalence, LlamaOnTokenShards) {
  test::TempDir dir;
  write_token_shards(dir);
  const std::string model =
      "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 36, heads: 6, "
      "kv_heads: 2, intermediate_size: 40, tie_embeddings: false, rope_scaling: llama3, "
      "rope_original_context: 8}\n"
      "data: {dataset: tokens, path: " +
      dir.path() + ", context: 16, vocab_size: 100, workers: 2}\n";
  expect_world_matches_self(model + kTrain);
}

// Llama's kin: qwen3 (q and k norms, head_dim 8 in a 36-wide model of 6 heads over 2) with a
// sliding window of 5 of the 16 positions, qwen2 (q, k, v biases), and gemma3 (sandwich norms of
// x (1 + w), GeGLU, the embedding scale, its first layer sliding), each unsharded and with every
// unit gathered (ddp.shard: parameters; a model built without storage).
class KinEquivalence
    : public ::testing::TestWithParam<std::tuple<const char*, const char*, const char*>> {};

TEST_P(KinEquivalence, OnTokenShards) {
  const auto& [family, extra, shard] = GetParam();
  test::TempDir dir;
  write_token_shards(dir);
  const std::string model =
      fmt::format("model: {{name: {0}, preset: {0}-tiny, num_layers: 2, d_model: 36, heads: 6, "
                  "kv_heads: 2, intermediate_size: 40, tie_embeddings: false{1}}}\n",
                  family, extra) +
      "data: {dataset: tokens, path: " + dir.path() +
      ", context: 16, vocab_size: 100, workers: 2}\n" + fmt::format("ddp: {{shard: {}}}\n", shard);
  expect_world_matches_self(model + kTrain);
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndShardModes, KinEquivalence,
    ::testing::Values(std::make_tuple("qwen3", ", head_dim: 8, sliding_window: 5", "none"),
                      std::make_tuple("qwen3", ", head_dim: 8, sliding_window: 5", "parameters"),
                      std::make_tuple("qwen2", "", "none"),
                      std::make_tuple("qwen2", "", "parameters"),
                      std::make_tuple("gemma3", ", head_dim: 8, sliding_window: 5", "none"),
                      std::make_tuple("gemma3", ", head_dim: 8, sliding_window: 5", "parameters")),
    [](const auto& info) {
      return std::string(std::get<0>(info.param)) + "_" + std::get<2>(info.param);
    });

// LoRA (model.lora_rank; models/lm/lora.h) on that llama, every target, under each ddp.shard
// mode: the adapters train alike on W ranks and on one, the base stays bitwise as it was.
class LoraEquivalence : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraEquivalence, LlamaAdaptersOnTokenShards) {
  test::TempDir dir;
  write_token_shards(dir);
  const std::string model =
      "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 36, heads: 6, "
      "kv_heads: 2, intermediate_size: 40, tie_embeddings: false, lora_rank: 4, lora_alpha: 8, "
      "lora_targets: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}\n"
      "data: {dataset: tokens, path: " +
      dir.path() + ", context: 16, vocab_size: 100, workers: 2}\n" +
      fmt::format("ddp: {{shard: {}}}\n", GetParam());
  expect_world_matches_self(model + kTrain);
}

INSTANTIATE_TEST_SUITE_P(ShardModes, LoraEquivalence,
                         ::testing::Values("none", "optimizer", "gradients", "parameters"),
                         [](const auto& info) { return std::string(info.param); });

// bf16 autocast (train.precision: bf16): matmuls round to bf16 (8 bits of mantissa), and the
// kernels may block a micro-batch of 2 differently from one of 3, so W ranks match one process
// to bf16's tolerance rather than fp32's.
TEST(ModelEquivalence, GptOnTokenShardsInBf16) {
  test::TempDir dir;
  for (const char* name : {"train_000.bin", "val_000.bin"}) {
    const at::Tensor tokens = (at::arange(6000, at::kLong) * 7919 % 97).to(at::kShort);
    FILE* f = std::fopen((dir.path() + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(tokens.data_ptr(), 2, 6000, f);
    std::fclose(f);
  }
  expect_world_matches_self(
      "model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n"
      "data: {dataset: tokens, path: " +
          dir.path() + ", context: 16, vocab_size: 100}\n" +
          std::string(kTrain).replace(std::string(kTrain).find("seed: 11"), 8,
                                      "seed: 11, precision: bf16"),
      1e-2, 1e-2);
}

std::string write_series(const test::TempDir& dir) {
  const std::string path = dir.path() + "/series.csv";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "time,temp,load\n");
  for (int i = 0; i < 400; ++i) {
    std::fprintf(f, "%d,%.4f,%.4f\n", i, std::sin(i * 0.1), std::cos(i * 0.07) + 0.01 * i);
  }
  std::fclose(f);
  return path;
}

TEST(ModelEquivalence, LstmOnCsv) {
  test::TempDir dir;
  expect_world_matches_self("model: {name: sequence, cell: lstm, hidden_dim: 16, num_layers: 2}\n"
                            "data: {dataset: csv, path: " +
                            write_series(dir) +
                            ", features: [temp, load], "
                            "targets: [load], window: 12, horizon: 2, val_fraction: 0.2}\n" +
                            kTrain);
}

// The attention's key bias has an exactly zero gradient (softmax ignores a constant added to
// every logit of a query); in floating point it is rounding noise, whose sign AdamW with eps 1e-8
// turns into full-size updates that differ between any two summation orders. eps 1e-4 keeps such
// noise from moving parameters while real gradients (1e-3 and up) train as usual.
TEST(ModelEquivalence, TransformerOnCsv) {
  test::TempDir dir;
  expect_world_matches_self(
      "model: {name: sequence, cell: transformer, d_model: 16, heads: 2, num_layers: 2}\n"
      "data: {dataset: csv, path: " +
      write_series(dir) +
      ", features: [temp, load], "
      "targets: [load], window: 12, horizon: 2, val_fraction: 0.2}\n" +
      std::string(kTrain).replace(std::string(kTrain).find("seed: 11"), 8,
                                  "seed: 11, eps: 1.0e-4"));
}

TEST(ModelEquivalence, CnnOnPngCrops) {
  expect_world_matches_self("model: {name: cnn, base_channels: 8, num_blocks: 2, loss: l1}\n"
                            "data: {dataset: images, path: " TRAINER_SOURCE_DIR
                            "/data/images-sample, patch_size: 16, "
                            "scale: 2, crops_per_image: 4, workers: 2}\n" +
                            std::string(kTrain));
}

}  // namespace TRAINER_UNITY_ID
