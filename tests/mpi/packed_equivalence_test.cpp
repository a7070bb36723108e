// Training on packed, masked documents (data.packing: documents; docs/DESIGN.md, "Global batch
// semantics"): W ranks with micro-batches of 2 equal one process with micro-batches of 3, though
// the number of targets per rank and per micro-batch is very uneven (documents without a target
// beside documents that are all targets, documents longer than the context split). The loss is the
// global batch's summed target losses over their number, so the gradient cannot depend on how the
// batch is split: after a few steps the parameters match one process to 1e-5 (the noise floor of
// changing the world size: other summation orders), under ddp.shard none and parameters, for gpt,
// llama and llama's LoRA adapters, and so do the validation loss and bits per byte.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/chat_shards.h"
#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "core/shape.h"
#include "data/registry.h"
#include "ddp/batch_plan.h"
#include "ddp/rank_sampler.h"
#include "models/capabilities.h"
#include "models/registry.h"
#include "train/evaluation.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

constexpr int64_t kGlobal = 7;

// Documents of 2 to 70 tokens (context 24: the long ones are split, their pieces fill windows
// alone) whose masks are all ones for every fourth, the second half for every fourth after it,
// and all zeros (no target) for the rest; ids below 100.
std::vector<test::Doc> documents(uint64_t seed, int count) {
  std::vector<test::Doc> docs;
  uint64_t x = seed;
  const auto next = [&x] { return x = x * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (int d = 0; d < count; ++d) {
    const int64_t length = 2 + static_cast<int64_t>((next() >> 33) % 69);
    test::Doc doc;
    for (int64_t i = 0; i < length; ++i) {
      doc.tokens.push_back(static_cast<uint16_t>((next() >> 33) % 100));
      doc.mask.push_back(d % 4 == 0 ? 1 : d % 4 == 1 ? static_cast<uint8_t>(i >= length / 2) : 0);
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::string write_data(const test::TempDir& dir) {
  test::write_chat_shard(dir.path() + "/train_000", documents(1, 90));
  test::write_chat_shard(dir.path() + "/val_000", documents(2, 12));
  return dir.path();
}

struct Run {
  std::vector<at::Tensor> parameters, initial;
  train::ValidationMetrics validation;
};

Run train_on(ddp::Communicator& comm, const std::string& yaml) {
  const auto config = config::parse_config(yaml, "packed-equivalence.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  Run run;
  for (const auto& p : model->parameters()) run.initial.push_back(p.detach().clone());
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= config.train.steps; ++s) trainer.step(s);
  {
    const auto pinned = trainer_test::pin_parameters(trainer);
    for (const auto& p : model->parameters()) run.parameters.push_back(p.detach().clone());
    run.validation = train::evaluate_validation(comm, *model, *dataset->validation(), 3, 0,
                                                at::ones({100}, at::kLong));
  }
  return run;
}

// The targets each rank's micro-batches hold at step 1 (micro-batch 2): what makes the split
// uneven. Fails unless some micro-batch holds none while another holds many.
void expect_uneven(const std::string& yaml, int world) {
  const auto config = config::parse_config(yaml, "packed-equivalence.yaml");
  const auto dataset = data::make_dataset(config.data);
  ddp::RankSampler sampler(dataset->size(), kGlobal, config.train.seed);
  std::vector<int64_t> counts;
  for (int r = 0; r < world; ++r) {
    const auto plan = ddp::BatchPlan::make(kGlobal, world, r, 2);
    int64_t offset = plan.offset;
    for (const int64_t n : plan.micro_sizes) {
      counts.push_back(dataset->target_count(sampler.indices(0, offset, n)));
      offset += n;
    }
  }
  const auto [least, most] = std::minmax_element(counts.begin(), counts.end());
  EXPECT_GT(*most, 4 * std::max<int64_t>(*least, 1)) << fmt::format("{}", fmt::join(counts, " "));
}

void expect_world_matches_self(const std::string& model, const std::string& shard) {
  test::TempDir dir;  // each rank writes the same files into its own directory
  const std::string data = "data: {dataset: tokens, path: " + write_data(dir) +
                           ", context: 24, vocab_size: 100, packing: documents, workers: 2}\n";
  const std::string train = fmt::format(
      "train: {{device: cpu, global_batch_size: {}, micro_batch_size: 2, steps: 4, lr: 0.003, "
      "warmup_steps: 1, seed: 5}}\n",
      kGlobal);
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  expect_uneven(model + data + train, world->size());
  const Run distributed = train_on(*world, model + data + train + "ddp: {shard: " + shard + "}\n");
  // One process with micro-batches of 3: another split of the global batch than any world's.
  std::string self_train = train;
  self_train.replace(self_train.find("micro_batch_size: 2"), 19, "micro_batch_size: 3");
  const Run reference = train_on(*self, model + data + self_train);
  const double err = relative_error(distributed.parameters, reference.parameters);
  EXPECT_LT(err, 1e-5) << "world " << world->size() << ", ddp.shard " << shard;
  EXPECT_GT(relative_error(reference.parameters, reference.initial), 1e-3) << "nothing trained";
  ASSERT_EQ(distributed.validation.means.size(), 2u);  // loss, bpb
  ASSERT_EQ(reference.validation.means.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& [name, value] = reference.validation.means[i];
    EXPECT_NEAR(distributed.validation.means[i].second, value, 1e-5 * std::abs(value)) << name;
  }
  if (world->rank() == 0) {
    fmt::print("world {}, ddp.shard {}: parameters {:.2e}; validation loss {:.6f} bpb {:.6f}\n",
               world->size(), shard, err, distributed.validation.means[0].second,
               distributed.validation.means[1].second);
  }
}

const char* kGpt = "model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n";
const char* kLlama =
    "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 36, heads: 6, kv_heads: 2, "
    "intermediate_size: 40, tie_embeddings: false}\n";

TEST(PackedEquivalence, GptUnsharded) { expect_world_matches_self(kGpt, "none"); }
TEST(PackedEquivalence, GptParametersSharded) { expect_world_matches_self(kGpt, "parameters"); }
TEST(PackedEquivalence, LlamaUnsharded) { expect_world_matches_self(kLlama, "none"); }
TEST(PackedEquivalence, LlamaParametersSharded) { expect_world_matches_self(kLlama, "parameters"); }
// LoRA adapters (model.lora_rank) trained on the packed, masked documents, the base frozen and
// sharded with them under parameters.
const char* kLlamaLora =
    "model: {name: llama, preset: llama-tiny, num_layers: 2, d_model: 36, heads: 6, kv_heads: 2, "
    "intermediate_size: 40, tie_embeddings: false, lora_rank: 4, lora_alpha: 8, "
    "lora_targets: [q_proj, v_proj, down_proj]}\n";
TEST(PackedEquivalence, LlamaLoraUnsharded) { expect_world_matches_self(kLlamaLora, "none"); }
TEST(PackedEquivalence, LlamaLoraParametersSharded) {
  expect_world_matches_self(kLlamaLora, "parameters");
}

// The validation loss is per target token and bits per byte counts the target tokens' bytes only,
// on every rank: against the model's own masked mean over every validation window at once (one
// process), and against the nats and bytes of the counted targets (1 byte per id here).
TEST(PackedEquivalence, ValidationLossAndBitsPerByteCountTargetTokensOnly) {
  test::TempDir dir;
  const auto config = config::parse_config(
      std::string(kGpt) + "data: {dataset: tokens, path: " + write_data(dir) +
          ", context: 24, vocab_size: 100, packing: documents}\ntrain: {device: cpu, "
          "global_batch_size: 7, seed: 5}\n",
      "packed-equivalence.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const auto validation = dataset->validation();
  const train::ValidationMetrics m =
      train::evaluate_validation(*world, *model, *validation, 2, 0, at::ones({100}, at::kLong));
  model->eval();
  at::NoGradGuard no_grad;
  const data::Batch all = validation->get(at::arange(validation->size(), at::kLong));
  const double targets = all.targets.ne(core::kIgnoreTarget).sum().item<double>();
  ASSERT_GT(targets, 0);
  ASSERT_LT(targets, static_cast<double>(all.targets.numel()) / 2);  // mostly not targets
  const double mean =
      models::loss_of(*model, all.inputs, all.targets, all.positions).item<double>();
  ASSERT_EQ(m.means.size(), 2u);
  EXPECT_EQ(m.means[0].first, "loss");
  EXPECT_NEAR(m.means[0].second, mean, 1e-5 * mean);
  EXPECT_EQ(m.means[1].first, "bpb");
  EXPECT_NEAR(m.means[1].second, mean / std::log(2.0), 1e-5 * mean);
  EXPECT_EQ(m.samples, validation->size());
}

}  // namespace TRAINER_UNITY_ID
