// Resuming across ranks: 6 steps, a checkpoint, a new model and Trainer resumed from it (rank 0
// alone reads the file), 6 more steps: the same parameters and AdamW moments as 12 steps
// without a break.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/mpi_test_env.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/gather.h"
#include "models/capabilities.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

const char* kConfig = R"(
model: {name: mlp, hidden_dim: 32, depth: 2}
data: {num_samples: 2000, input_dim: 10, num_classes: 4, teacher_hidden: 8, seed: 2}
train: {device: cpu, global_batch_size: 48, micro_batch_size: 8, steps: 12, lr: 0.01, warmup_steps: 2, grad_clip: 0.5, weight_decay: 0.1, seed: 9}
)";

// Trains steps [resume's step, until) after building the model from `model_seed`.
std::vector<at::Tensor> train_until(ddp::Communicator& comm, int64_t until, uint64_t model_seed,
                                    const std::string& resume_from, const std::string& save_to) {
  return trainer_test::train_until(comm, kConfig, until, model_seed, resume_from, save_to);
}

TEST(Resume, HalfAndHalfEqualsOneRun) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  // One directory for every rank: rank 0's.
  std::string dir = fmt::format("/tmp/trainer_resume_{}", ::getpid());
  dir = ddp::all_gather_strings(*comm, dir)[0];
  const std::string half = dir + "/step_000006.safetensors";
  const std::string whole = dir + "/step_000012.safetensors";

  const auto straight = train_until(*comm, 12, 1, "", whole);
  train_until(*comm, 6, 1, "", half);
  comm->barrier("checkpoint written");
  const auto resumed = train_until(*comm, 12, 77, half, "");  // other initial weights: overwritten
  EXPECT_LT(relative_error(resumed, straight), 1e-6);

  // The moments too: the resumed run's checkpoint equals the straight one's.
  const std::string again = dir + "/again.safetensors";
  train_until(*comm, 12, 77, half, again);
  if (comm->rank() == 0) {
    const auto a = checkpoint::read_checkpoint(whole);
    const auto b = checkpoint::read_checkpoint(again);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [key, t] : a.tensors) {
      EXPECT_LT(relative_error({b.tensors.at(key)}, {t}), 1e-6) << key;
    }
    EXPECT_EQ(b.meta.step, 12);
    for (const auto& f : {half, whole, again}) ::unlink(f.c_str());
    ::rmdir(dir.c_str());
  }
  comm->barrier("cleanup");
}

// LoRA (model.lora_rank; models/lm/lora.h): a checkpoint holds the adapters and their moments,
// not the frozen base, which every start rebuilds (here: from the same seed, as model.init_from
// loads it); it records the base's hash, and resumes exactly at another world size and mode.
const char* kLora = "lora_rank: 4, lora_alpha: 8, lora_targets: [q_proj, v_proj, down_proj]";

std::string lora_yaml(const std::string& shard, const std::string& format, int intermediate = 40,
                      const std::string& lora = kLora) {
  return fmt::format("model: {{name: llama, preset: llama-tiny, num_layers: 2, d_model: 32, "
                     "heads: 4, kv_heads: 2, intermediate_size: {}, tie_embeddings: false, {}}}\n",
                     intermediate, lora) +
         "data: {dataset: tokens, path: " TRAINER_SOURCE_DIR
         "/data/tokens-sample, context: 16, vocab_size: 256, workers: 1}\n"
         "train: {device: cpu, global_batch_size: 6, micro_batch_size: 1, steps: 8, lr: 0.01, "
         "warmup_steps: 1, seed: 11}\n"
         "memory: {check_every: 0}\n" +
         fmt::format("checkpoint: {{format: {}}}\nddp: {{shard: {}}}\n", format, shard);
}

// Rank 0: the checkpoint at `path` holds the adapters, their two moments and no tensor of the
// base, and names the model's base.
void expect_adapters_only(const std::string& path, const std::string& yaml) {
  const auto ckpt = checkpoint::read_checkpoint(path);
  const auto config = config::parse_config(yaml, "lora_resume.yaml");
  at::manual_seed(5);
  auto model = models::create_model(config.model, data::make_dataset(config.data)->shape());
  const auto* frozen = models::as<models::FrozenBase>(*model);
  ASSERT_NE(frozen, nullptr);
  ASSERT_FALSE(frozen->frozen_buffer_names().empty());
  EXPECT_EQ(ckpt.meta.base_hash, frozen->base_hash());
  EXPECT_EQ(ckpt.tensors.size(), 3 * model->parameters().size()) << path;
  for (const auto& [key, t] : ckpt.tensors) {
    EXPECT_THAT(key, ::testing::HasSubstr(".lora_")) << path;  // the adapters' and their moments
  }
  int64_t base = 0, held = 0;
  for (const auto& b : model->buffers()) base += b.nbytes();
  for (const auto& [key, t] : ckpt.tensors) held += t.nbytes();
  fmt::print("LoRA checkpoint {}: {} tensor bytes; the frozen base: {} bytes\n", path, held, base);
}

class LoraResume : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = trainer_test::runtime().world(std::chrono::seconds(60));
    if (world_->size() < 2) GTEST_SKIP() << "needs 2 ranks";
    smaller_ = trainer_test::all_but_last_rank(*world_);
    dir_ =
        ddp::all_gather_strings(*world_, fmt::format("/tmp/trainer_lora_resume_{}", ::getpid()))[0];
  }
  void TearDown() override {
    if (!world_ || world_->size() < 2) return;
    world_->barrier("cleanup");
    if (world_->rank() != 0) return;
    // Not std::filesystem::remove_all: the test binary may bind it to libtorch's copy.
    for (const auto& p : written_) {
      if (p.ends_with(".safetensors")) {
        ::unlink(p.c_str());
      } else {
        checkpoint::remove_step_dir(p);
      }
    }
    ::rmdir(dir_.c_str());
  }
  // 4 steps on `writer` under (shard, format) then a resume on `reader` under `resume_shard` to
  // step 8, against 8 steps straight on `reader`. The base is rebuilt from seed 5 each time;
  // the adapters' initial draw differs (seed 5 against the resumed run's, overwritten).
  void check(ddp::Communicator* writer, ddp::Communicator* reader, const std::string& shard,
             const std::string& format, const std::string& resume_shard, const std::string& name) {
    // Saved as NAME.safetensors: a sharded checkpoint is the step directory NAME.
    const std::string file = dir_ + "/" + name + ".safetensors";
    const std::string half = format == "single" ? file : dir_ + "/" + name;
    const std::string written = lora_yaml(shard, format);
    written_.push_back(half);
    if (writer != nullptr) trainer_test::train_until(*writer, written, 4, 5, "", file);
    world_->barrier("checkpoint written");
    if (world_->rank() == 0) expect_adapters_only(half, written);
    if (reader != nullptr) {
      const std::string text = lora_yaml(resume_shard, format);
      const auto straight = trainer_test::train_until(*reader, text, 8, 5, "", "");
      const auto resumed = trainer_test::train_until(*reader, text, 8, 5, half, "");
      // Another world size reduces in another order: equal within fp32's noise, not bitwise.
      EXPECT_LT(relative_error(resumed, straight), 1e-5) << name;
    }
    world_->barrier("resumed");
  }
  std::unique_ptr<ddp::Communicator> world_, smaller_;
  std::string dir_;
  std::vector<std::string> written_;  // the checkpoints, for TearDown
};

// W ranks under parameters write sharded; W - 1 ranks resume under none (the issue's 3 -> 2).
TEST_F(LoraResume, ShardedOnFewerRanksUnderAnotherMode) {
  check(world_.get(), smaller_.get(), "parameters", "sharded", "none", "sharded_fewer");
}

// W - 1 ranks under optimizer write one file; W ranks resume under gradients (2 -> 3).
TEST_F(LoraResume, SingleFileOnMoreRanksUnderAnotherMode) {
  check(smaller_.get(), world_.get(), "optimizer", "single", "gradients", "single_more");
}

// W ranks under parameters write one file (the adapters gathered, the base left sharded);
// W - 1 ranks resume under none.
TEST_F(LoraResume, SingleFileUnderParametersOnFewerRanks) {
  check(world_.get(), smaller_.get(), "parameters", "single", "none", "single_parameters");
}

// A checkpoint of one base is refused onto another (its config differs), naming both, and onto a
// model without adapters.
TEST_F(LoraResume, AnotherBaseIsRefusedNamingBoth) {
  const std::string half = dir_ + "/base.safetensors";
  written_.push_back(half);
  trainer_test::train_until(*world_, lora_yaml("none", "single"), 2, 5, "", half);
  if (world_->rank() != 0) return;
  const auto ckpt = checkpoint::read_checkpoint(half);
  auto model_of = [](const std::string& yaml) {
    const auto config = config::parse_config(yaml, "lora_resume.yaml");
    return models::create_model(config.model, data::make_dataset(config.data)->shape());
  };
  auto other = model_of(lora_yaml("none", "single", 48));
  const std::string other_hash = models::as<models::FrozenBase>(*other)->base_hash();
  ASSERT_NE(other_hash, ckpt.meta.base_hash);
  try {
    checkpoint::check_compatible(ckpt, *other);
    ADD_FAILURE() << "a checkpoint of another base was accepted";
  } catch (const checkpoint::CheckpointError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("another base"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(ckpt.meta.base_hash));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(other_hash));
  }
  auto plain = model_of(lora_yaml("none", "single", 40, "lora_rank: 0"));
  try {
    checkpoint::check_compatible(ckpt, *plain);
    ADD_FAILURE() << "LoRA adapters were accepted as a whole model";
  } catch (const checkpoint::CheckpointError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("holds LoRA adapters of the base"));
  }
}

}  // namespace TRAINER_UNITY_ID
