// Resuming from a sharded checkpoint (checkpoint.format: sharded) reads, on every rank, only what
// that rank keeps (issue 25, item 4; docs/DESIGN.md "Checkpoints", "Who reads"). A checkpoint
// written at another world size and mode is resumed twice under each mode: read whole by rank 0,
// which hands the moments out (ShardedRead::kWhole, the way resume went before), and opened
// (ShardedRead::kOpen, the launcher's way: every rank reads its ranges from the files). Checked:
// - each rank's moments (its blocks, or the whole moments unsharded), its master shards under
//   ddp.shard: parameters and the model's parameters are bitwise equal both ways;
// - each rank read exactly the moment bytes it keeps (the elements of its blocks; padding is in
//   no file), which is a share, not the whole, under a sharded mode; rank 0 read that plus the
//   model's tensors and nothing else (io::safetensors_bytes_read(): a rank 0 that assembled every
//   tensor again would read the whole files);
// - channels-last weights (held by their strides in the buckets) come out the same way: written
//   in their memory order (the manifest's element order), each rank reads only its ranges; into
//   buckets of another order, it reads them whole and lays them out;
// - a rank that cannot read its part fails every rank, naming the file, instead of hanging.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <optional>

#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "checkpoint_dir_fixture.h"
#include "common/mpi_test_env.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/gather.h"
#include "io/safetensors.h"
#include "io/shard_manifest.h"
#include "models/registry.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

const char* kMlp = R"(
model: {name: mlp, hidden_dim: 32, depth: 2}
data: {num_samples: 2000, input_dim: 10, num_classes: 4, teacher_hidden: 8, seed: 2}
train: {device: cpu, global_batch_size: 47, micro_batch_size: 8, steps: 12, lr: 0.01, warmup_steps: 2, grad_clip: 0.5, weight_decay: 0.1, seed: 9}
)";

// Channels-last convolution weights: a bucket holds them by their strides, not row-major.
#define TRAINER_TEST_CNN(CHANNELS_LAST)                                                   \
  "model: {name: cnn, base_channels: 4, num_blocks: 1, loss: l1}\n"                       \
  "data: {dataset: images, path: " TRAINER_SOURCE_DIR                                     \
  "/data/images-sample, patch_size: 8, scale: 2, crops_per_image: 2}\n"                   \
  "train: {device: cpu, global_batch_size: 7, micro_batch_size: 2, steps: 3, lr: 0.003, " \
  "warmup_steps: 1, seed: 11, channels_last: " CHANNELS_LAST "}\n"
const char* kChannelsLastCnn = TRAINER_TEST_CNN("on");
const char* kRowMajorCnn = TRAINER_TEST_CNN("off");  // the same model, its weights row-major

std::string yaml(const std::string& shard, const char* base = kMlp) {
  return std::string(base) + "memory: {check_every: 0}\ncheckpoint: {format: sharded}\n" +
         fmt::format("ddp: {{shard: {}, first_bucket_mb: 0.002, bucket_mb: 0.005}}\n", shard);
}

// One rank's state right after resume(), and what it read.
struct Resumed {
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, masters, params;
  int64_t moment_bytes = 0;  // Checkpointer::resume_bytes_read()
  int64_t all_bytes = 0;     // every tensor byte this process read, rank 0's choice included
  int64_t kept_bytes = 0;    // the moments' bytes this rank keeps (its blocks without padding)
  int64_t total_moment_bytes = 0;
  int64_t model_bytes = 0;  // the model's parameters and buffers
};

int64_t kept_moment_bytes(const train::Trainer& trainer, models::Model& model,
                          const io::ShardManifest& manifest) {
  const auto named = model.named_parameters();
  const auto& reducer = trainer.reducer();
  int64_t elements = 0;
  if (!reducer.sharded()) {
    for (const auto& p : model.parameters()) elements += p.numel();
  } else {
    const auto shards = reducer.shards();
    for (size_t b = 0; b < reducer.layout().size(); ++b) {
      const auto& layout = reducer.layout()[b];
      for (size_t j = 0; j < layout.params.size(); ++j) {
        const at::Tensor& p = named[layout.params[j]].value();
        const auto [first, last] = shards[b].owned(layout.offsets[j], p.numel());
        // A parameter the bucket holds in another order than the file (say channels-last and
        // row-major) is read whole, then laid out.
        const bool same_order =
            manifest.tensors.at(checkpoint::exp_avg_key(named[layout.params[j]].key())).order ==
            checkpoint::element_order_of(p);
        if (first < last) elements += same_order ? last - first : p.numel();
      }
    }
  }
  return 2 * elements * static_cast<int64_t>(sizeof(float));  // two fp32 moments
}

Resumed resume(ddp::Communicator& comm, const std::string& yaml_text, const std::string& step_dir,
               checkpoint::ShardedRead how) {
  const auto config = config::parse_config(yaml_text, "sharded_resume.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(77);  // other initial weights: the checkpoint overwrites them
  auto model = models::create_model(config.model, dataset->shape());
  Resumed r;
  for (const auto& [key, t] : checkpoint::model_entries(*model)) r.model_bytes += t.nbytes();
  const int64_t before = io::safetensors_bytes_read();
  std::optional<checkpoint::Checkpoint> ckpt;
  if (comm.rank() == 0) {  // as the launcher's select_resume
    ckpt = checkpoint::read_checkpoint(step_dir, how);
    checkpoint::check_compatible(*ckpt, *model);
    checkpoint::apply_model_state(*ckpt, *model);
  }
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  const auto checkpointer = train::make_checkpointer(trainer, "");
  train::resume(*checkpointer, trainer, ckpt ? &*ckpt : nullptr);
  r.all_bytes = io::safetensors_bytes_read() - before;
  r.moment_bytes = checkpointer->resume_bytes_read();
  r.kept_bytes = kept_moment_bytes(trainer, *model, io::read_manifest(step_dir));
  for (const auto& p : model->parameters()) r.total_moment_bytes += 2 * p.nbytes();
  for (const auto& t : trainer.optimizer().exp_avgs()) r.exp_avgs.push_back(t.clone());
  for (const auto& t : trainer.optimizer().exp_avg_sqs()) r.exp_avg_sqs.push_back(t.clone());
  for (const auto& t : trainer.reducer().parameter_shards()) r.masters.push_back(t.clone());
  const auto pinned =
      trainer_test::pin_parameters(trainer);  // ddp.shard: parameters: the whole model
  r.params = trainer_test::snapshot(*model);
  return r;
}

void expect_bitwise(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << what << " " << i;
}

class ShardedResume : public trainer_test::CheckpointDirTest {
 protected:
  // Trains 3 steps on `comm` under `shard` and writes a sharded checkpoint; returns its directory.
  std::string write(ddp::Communicator* comm, const std::string& shard, const std::string& name,
                    const char* base = kMlp) {
    const std::string step_dir = this->step_dir(name);
    if (comm != nullptr) {
      written_[step_dir] =
          trainer_test::train_until(*comm, yaml(shard, base), 3, 1, "", step_dir + ".safetensors");
    }
    world_->barrier("checkpoint written");
    return step_dir;
  }
  // Resumes `step_dir` on `comm` under each mode both ways, and checks.
  void check_resumes(ddp::Communicator& comm, const std::string& step_dir,
                     const std::vector<std::string>& modes, const char* base = kMlp) {
    for (const auto& shard : modes) {
      const std::string text = yaml(shard, base);
      const Resumed whole = resume(comm, text, step_dir, checkpoint::ShardedRead::kWhole);
      const Resumed opened = resume(comm, text, step_dir, checkpoint::ShardedRead::kOpen);
      const std::string what =
          fmt::format("{} on {} ranks, rank {}", shard, comm.size(), comm.rank());
      expect_bitwise(opened.exp_avgs, whole.exp_avgs, "exp_avg, " + what);
      expect_bitwise(opened.exp_avg_sqs, whole.exp_avg_sqs, "exp_avg_sq, " + what);
      expect_bitwise(opened.masters, whole.masters, "master shards, " + what);
      expect_bitwise(opened.params, whole.params, "parameters, " + what);
      if (comm.rank() == 0) {  // world rank 0, which wrote too: what it wrote, read back
        expect_bitwise(opened.params, written_.at(step_dir), "parameters written, " + what);
      }
      EXPECT_EQ(whole.moment_bytes, 0) << what;  // rank 0 handed them out
      EXPECT_EQ(opened.moment_bytes, opened.kept_bytes) << what;
      if (shard != "none" && base == kMlp) {  // a share: about 1/W of both moments
        EXPECT_LE(opened.moment_bytes, opened.total_moment_bytes / comm.size() + 1024) << what;
      }
      EXPECT_EQ(opened.all_bytes, opened.moment_bytes + (comm.rank() == 0 ? opened.model_bytes : 0))
          << what;
      if (comm.rank() == 0) {
        fmt::print("sharded resume, {}: rank 0 read {} moment bytes of {} ({} with the model); "
                   "read whole, {}\n",
                   what, opened.moment_bytes, opened.total_moment_bytes, opened.all_bytes,
                   whole.all_bytes);
      }
    }
  }

  std::map<std::string, std::vector<at::Tensor>> written_;  // the writers' parameters, by step_dir
};

// W - 1 ranks under parameters write; W ranks resume under none, optimizer and parameters.
TEST_F(ShardedResume, OnMoreRanksEachRankReadsOnlyItsShare) {
  const std::string step_dir = write(smaller_.get(), "parameters", "from_fewer");
  check_resumes(*world_, step_dir, {"none", "optimizer", "parameters"});
}

// W ranks under optimizer write; W - 1 ranks resume under none and gradients.
TEST_F(ShardedResume, OnFewerRanksEachRankReadsOnlyItsShare) {
  const std::string step_dir = write(world_.get(), "optimizer", "from_more");
  if (smaller_) check_resumes(*smaller_, step_dir, {"none", "gradients"});
}

// The conv weights' element order in a checkpoint's manifest ("" for row-major).
std::string conv_order(const std::string& step_dir) {
  return fmt::format("{}", io::read_manifest(step_dir).tensors.at("param.head.weight").order);
}

// A CNN whose convolution weights are channels-last (train.channels_last: on), written unsharded:
// its slices are cut in the weights' memory order, the buckets' order, so each rank of a sharded
// reader reads only its ranges of them.
TEST_F(ShardedResume, ChannelsLastWeightsAreLaidOutByTheirStrides) {
  const std::string step_dir = write(smaller_.get(), "none", "cnn", kChannelsLastCnn);
  if (world_->rank() == 0) {
    EXPECT_EQ(conv_order(step_dir), "[0, 2, 3, 1]");
  }
  check_resumes(*world_, step_dir, {"none", "optimizer"}, kChannelsLastCnn);
}

// Written row-major (channels_last off), resumed channels-last: the orders differ, so each rank
// reads the weights' moments whole and lays them out as its buckets hold them.
TEST_F(ShardedResume, RowMajorWeightsIntoChannelsLastBuckets) {
  const std::string step_dir = write(world_.get(), "optimizer", "cnn_row_major", kRowMajorCnn);
  if (world_->rank() == 0) {
    EXPECT_EQ(conv_order(step_dir), "[]");
  }
  if (smaller_) check_resumes(*smaller_, step_dir, {"parameters"}, kChannelsLastCnn);
}

// Under a sharded mode the buckets hold channels-last weights in their memory order, which the
// manifest records: the checkpoint is sharded, resumes both ways at another world size into
// channels-last or row-major buckets, and 3 steps + 3 resumed equal 6 steps.
TEST_F(ShardedResume, ChannelsLastUnderAShardedModeIsShardedInItsMemoryOrder) {
  const std::string step_dir = write(world_.get(), "optimizer", "cnn_optimizer", kChannelsLastCnn);
  if (world_->rank() == 0) {
    ASSERT_TRUE(checkpoint::is_sharded_checkpoint(step_dir));
    EXPECT_EQ(conv_order(step_dir), "[0, 2, 3, 1]");
  }
  if (smaller_) {
    check_resumes(*smaller_, step_dir, {"none", "parameters"}, kChannelsLastCnn);
    check_resumes(*smaller_, step_dir, {"gradients"}, kRowMajorCnn);
  }
  world_->barrier("resumed on fewer ranks");
  for (const char* base : {kChannelsLastCnn, kRowMajorCnn}) {
    const auto straight = trainer_test::train_until(*world_, yaml("none", base), 6, 1, "", "");
    const auto resumed =
        trainer_test::train_until(*world_, yaml("parameters", base), 6, 77, step_dir, "");
    EXPECT_LT(trainer_test::relative_error(resumed, straight), 1e-6) << base;
  }
}

// Rank 0 chose and verified the checkpoint; then its manifest is damaged, so every other rank
// fails to read its part (rank 0 reads with the manifest it verified). Every rank fails, with a
// message naming the file, and none waits for the others.
TEST_F(ShardedResume, ARankThatCannotReadFailsEveryRank) {
  const std::string step_dir = write(world_.get(), "optimizer", "damaged");
  const auto config = config::parse_config(yaml("optimizer"), "sharded_resume.yaml");
  const auto dataset = data::make_dataset(config.data);
  auto model = models::create_model(config.model, dataset->shape());
  std::optional<checkpoint::Checkpoint> ckpt;
  if (world_->rank() == 0) {
    ckpt = checkpoint::read_checkpoint(step_dir, checkpoint::ShardedRead::kOpen);
    checkpoint::apply_model_state(*ckpt, *model);
    std::ofstream(step_dir + "/" + io::kShardManifestName) << "{ not json";
  }
  train::Trainer trainer(config.trainer_options(), *world_, *world_, model, *dataset,
                         c10::Device(c10::kCPU));
  const auto checkpointer = train::make_checkpointer(trainer, "");
  try {
    train::resume(*checkpointer, trainer, ckpt ? &*ckpt : nullptr);
    ADD_FAILURE() << "rank " << world_->rank() << " resumed";
  } catch (const checkpoint::CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr(io::kShardManifestName));
    if (world_->rank() == 0) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1 could not read its part"));
    }
  }
}

}  // namespace TRAINER_UNITY_ID
