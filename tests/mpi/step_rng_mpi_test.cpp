// Exact continuation with dropout (train/step_rng.h): a gpt with dropout 0.1 trained 8 steps
// straight, and trained 4 steps, checkpointed, and resumed in a fresh Trainer for 4 more, ends
// with bitwise equal parameters and AdamW moments, with and without activation checkpointing
// (whose recompute restores the generators around itself). Without the per-step reseeding the
// resumed run draws other masks: the fresh Trainer's memory probe alone moves the stream. That
// the masks are drawn at all is checked too: the run without dropout ends elsewhere.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <optional>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/mpi_test_env.h"
#include "config/config.h"
#include "ddp/gather.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

std::string config_yaml(bool checkpoint_activations, double dropout = 0.1) {
  return fmt::format(
      "model: {{name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4, dropout: {}, "
      "checkpoint_activations: {}}}\n"
      "data: {{dataset: tokens, path: {}/data/tokens-sample, context: 16, vocab_size: 256, "
      "workers: 1}}\n"
      "train: {{device: cpu, global_batch_size: 7, micro_batch_size: 2, steps: 8, lr: 0.003, "
      "warmup_steps: 2, seed: 21}}\n",
      dropout, checkpoint_activations, TRAINER_SOURCE_DIR);
}

void expect_exact_continuation(bool checkpoint_activations) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const std::string yaml = config_yaml(checkpoint_activations);
  // One directory for every rank: rank 0's (only rank 0 writes and reads).
  std::string dir = fmt::format("/tmp/trainer_step_rng_{}", ::getpid());
  dir = ddp::all_gather_strings(*comm, dir)[0];
  const std::string straight = dir + "/straight.safetensors";
  const std::string half = dir + "/half.safetensors";
  const std::string resumed = dir + "/resumed.safetensors";

  using trainer_test::train_until;
  const auto straight_params = train_until(*comm, yaml, 8, 1, "", straight);
  // The masks are really drawn: without dropout the same run ends elsewhere (else the equality
  // below would hold whatever the generators did).
  const auto no_dropout =
      train_until(*comm, config_yaml(checkpoint_activations, 0.0), 8, 1, "", "");
  ASSERT_EQ(no_dropout.size(), straight_params.size());
  bool dropout_mattered = false;
  for (size_t i = 0; i < no_dropout.size(); ++i) {
    dropout_mattered = dropout_mattered || !at::equal(no_dropout[i], straight_params[i]);
  }
  EXPECT_TRUE(dropout_mattered) << "dropout 0.1 trained to the same parameters as dropout 0";
  train_until(*comm, yaml, 4, 1, "", half);
  // Some draws between the runs, as a fresh process would have made others.
  at::rand({1000});
  train_until(*comm, yaml, 8, 77, half, resumed);
  if (comm->rank() == 0) {
    const auto a = checkpoint::read_checkpoint(straight);
    const auto b = checkpoint::read_checkpoint(resumed);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    int params = 0;
    for (const auto& [key, t] : a.tensors) {
      ASSERT_TRUE(b.tensors.count(key)) << key;
      EXPECT_TRUE(at::equal(b.tensors.at(key), t)) << key << " differs";
      params += key.rfind("param.", 0) == 0;
    }
    EXPECT_GT(params, 0);
    EXPECT_EQ(b.meta.step, 8);
    for (const auto& f : {straight, half, resumed}) ::unlink(f.c_str());
    ::rmdir(dir.c_str());
  }
  comm->barrier("cleanup");
}

TEST(StepRngMpi, ResumedRunWithDropoutIsBitwiseTheStraightOne) { expect_exact_continuation(false); }

TEST(StepRngMpi, ResumedRunWithDropoutAndActivationCheckpointingIsBitwiseTheStraightOne) {
  expect_exact_continuation(true);
}

}  // namespace TRAINER_UNITY_ID
