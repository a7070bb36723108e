// Sharded checkpoints (checkpoint/sharded.h), written here rank by rank in one process as
// the ranks of a job write them: what W ranks write (sliced unsharded state, or blocks of padded
// buckets) reads back as the whole tensors; a missing or damaged shard file is refused by name
// and resume "auto" takes the previous complete checkpoint; a directory without its manifest (an
// interrupted write) is no checkpoint; keep_last prunes step directories. Opened for resume
// (ShardedRead::kOpen), a checkpoint is verified without reading tensor data, and its ranges and
// model state read from the files equal the whole read.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/temp_dir.h"
#include "ddp/shard.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

std::shared_ptr<models::Model> mlp(uint64_t seed) {
  at::manual_seed(seed);
  models::ModelOptions o;
  o.name = "mlp";
  o.hidden_dim = 7;  // 5 parameters of sizes that no world size below divides
  o.depth = 2;
  core::Shape shape;
  shape.input_dim = 5;
  shape.num_classes = 3;
  return models::create_model(o, shape);
}

// The state of a run of `model` on `world` ranks with moments filled from `fill`; `bucketed`: one
// bucket of every parameter, padded and cut into blocks as a sharded mode holds it (the blocks
// for `rank` only).
struct FakeRun {
  std::vector<ddp::BucketLayout> layout;
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs;  // full, per parameter
  checkpoint::ShardedState state(models::Model& model, int world, int rank, bool bucketed) const {
    checkpoint::ShardedState s;
    for (const auto& item : model.named_parameters())
      s.params.emplace_back(item.key(), item.value());
    for (const auto& [key, t] : checkpoint::model_entries(model)) {
      if (key.starts_with("buffer.")) s.buffers.emplace_back(key, t);
    }
    if (!bucketed) {
      s.exp_avgs = exp_avgs;
      s.exp_avg_sqs = exp_avg_sqs;
      return s;
    }
    s.layout = &layout;
    const ddp::BucketShard shard = ddp::shard_bucket(layout[0].numel, world, rank);
    auto block = [&](std::vector<at::Tensor> parts) {
      for (auto& p : parts) p = p.detach().reshape({-1});
      at::Tensor flat = at::cat(parts);
      flat = at::constant_pad_nd(flat, {0, shard.padded - flat.numel()});
      return std::vector<at::Tensor>{flat.narrow(0, shard.begin, shard.size).clone()};
    };
    s.param_blocks = block(model.parameters());
    s.exp_avgs = block(exp_avgs);
    s.exp_avg_sqs = block(exp_avg_sqs);
    return s;
  }
};

FakeRun make_run(models::Model& model, double fill) {
  FakeRun r;
  ddp::BucketLayout bucket;
  for (const auto& p : model.parameters()) {
    bucket.params.push_back(bucket.params.size());
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += p.numel();
    r.exp_avgs.push_back(at::rand_like(p) * fill);
    r.exp_avg_sqs.push_back(at::rand_like(p) * fill * fill);
  }
  r.layout.push_back(bucket);
  return r;
}

// Every rank's file, then rank 0's manifest and commit, as Checkpointer::save and finish do.
void write_sharded(const std::string& step_dir, models::Model& model, const FakeRun& run, int world,
                   bool bucketed, int64_t step) {
  io::ShardManifest m;
  m.world_size = world;
  m.shard_mode = bucketed ? "optimizer" : "none";
  m.step = step;
  m.global_batch_size = 96;
  m.seed = 42;
  for (int r = 0; r < world; ++r) {
    const auto s = run.state(model, world, r, bucketed);
    if (r == 0) m.tensors = checkpoint::logical_tensors(s);
    auto content = checkpoint::shard_content(s, world, r, true);
    std::map<std::string, at::Tensor> host;
    for (const auto& [key, t] : content.tensors) host[key] = t.contiguous().clone();
    io::ShardFile file = checkpoint::write_shard_file(step_dir + ".tmp", r, step, host);
    file.pieces = checkpoint::shard_content(s, world, r, false).pieces;
    EXPECT_EQ(file.pieces.size(), content.pieces.size());
    m.files.push_back(file);
  }
  checkpoint::commit_sharded_checkpoint(step_dir, m);
}

void expect_holds(const checkpoint::Checkpoint& ckpt, models::Model& model, const FakeRun& run) {
  checkpoint::check_compatible(ckpt, model);
  size_t i = 0;
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(ckpt.tensors.at("param." + item.key()).equal(item.value().detach())) << item.key();
    EXPECT_TRUE(ckpt.tensors.at(checkpoint::exp_avg_key(item.key())).equal(run.exp_avgs[i]));
    EXPECT_TRUE(ckpt.tensors.at(checkpoint::exp_avg_sq_key(item.key())).equal(run.exp_avg_sqs[i]));
    ++i;
  }
}

TEST(ShardedCheckpoint, SlicesAndBucketBlocksOfAnyWorldSizeReadBackWhole) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun run = make_run(*model, 0.5);
  for (int world : {1, 2, 3, 5}) {
    for (bool bucketed : {false, true}) {
      const std::string step_dir = dir.file(fmt::format("w{}_{}", world, bucketed));
      write_sharded(step_dir, *model, run, world, bucketed, 7);
      ASSERT_TRUE(checkpoint::is_sharded_checkpoint(step_dir));
      const auto ckpt = checkpoint::read_checkpoint(step_dir);
      EXPECT_EQ(ckpt.meta.step, 7);
      EXPECT_EQ(ckpt.meta.world_size, world);
      expect_holds(ckpt, *model, run);
      // Each rank wrote its own part: no element of a parameter is in two files.
      const auto manifest = io::read_manifest(step_dir);
      EXPECT_EQ(manifest.files.size(), static_cast<size_t>(world));
    }
  }
}

TEST(ShardedCheckpoint, AMissingOrDamagedShardIsRefusedByNameAndAutoTakesThePrevious) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun older = make_run(*model, 0.1), newer = make_run(*model, 0.2);
  write_sharded(dir.file("step_000010"), *model, older, 3, true, 10);
  write_sharded(dir.file("step_000020"), *model, newer, 3, true, 20);
  write_sharded(dir.file("step_000030"), *model, newer, 3, false, 30);
  {  // a byte of rank 1's file of step 20 flipped
    std::fstream f(dir.file("step_000020/rank_00001.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.write("\x7f", 1);
  }
  ASSERT_EQ(::unlink(dir.file("step_000030/rank_00002.safetensors").c_str()), 0);
  // An interrupted write: files, no manifest.
  ASSERT_EQ(::mkdir(dir.file("step_000040.tmp").c_str(), 0755), 0);
  std::ofstream(dir.file("step_000040.tmp/rank_00000.safetensors")) << "partial";
  std::vector<std::string> skipped;
  checkpoint::Checkpoint ckpt;
  EXPECT_EQ(checkpoint::newest_good_checkpoint(dir.path(), &skipped, &ckpt),
            dir.file("step_000010"));
  EXPECT_EQ(ckpt.meta.step, 10);
  expect_holds(ckpt, *model, older);
  EXPECT_THAT(skipped, ::testing::ElementsAre(HasSubstr("step_000030/rank_00002.safetensors"),
                                              HasSubstr("step_000020/rank_00001.safetensors")));
  try {
    checkpoint::read_checkpoint(dir.file("step_000020"));
    ADD_FAILURE() << "a damaged shard was read";
  } catch (const checkpoint::CheckpointDamaged& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank_00001.safetensors"));
  }
}

TEST(ShardedCheckpoint, OpenedReadsNoTensorDataAndItsRangesEqualTheWholeRead) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun run = make_run(*model, 0.5);
  for (bool bucketed : {false, true}) {
    const std::string step_dir = dir.file(fmt::format("w3_{}", bucketed));
    write_sharded(step_dir, *model, run, 3, bucketed, 7);
    const auto whole = checkpoint::read_checkpoint(step_dir);
    const int64_t before = io::safetensors_bytes_read();
    const auto opened = checkpoint::read_checkpoint(step_dir, checkpoint::ShardedRead::kOpen);
    EXPECT_EQ(io::safetensors_bytes_read(), before) << "opening read tensor data";
    EXPECT_TRUE(opened.tensors.empty());
    ASSERT_TRUE(opened.manifest.has_value());
    EXPECT_EQ(opened.meta.step, 7);
    checkpoint::check_compatible(opened, *model);
    // The model's tensors, read from the files, equal the whole read's.
    auto fresh = mlp(2);
    checkpoint::apply_model_state(opened, *fresh);
    for (const auto& [key, t] : checkpoint::model_entries(*fresh)) {
      EXPECT_TRUE(t.equal(whole.tensors.at(key))) << key;
    }
    // Any range of any logical tensor, across the writers' pieces.
    checkpoint::ShardedReader reader(step_dir, *opened.manifest);
    for (const auto& [name, t] : whole.tensors) {
      const at::Tensor flat = t.reshape({-1});
      const int64_t n = flat.numel();
      for (const auto& [offset, count] :
           std::vector<std::pair<int64_t, int64_t>>{{0, n}, {1, n - 2}, {n / 2, n - n / 2}}) {
        at::Tensor out = at::empty({count}, t.options());
        reader.read(name, offset, out);
        EXPECT_TRUE(out.equal(flat.narrow(0, offset, count))) << name << " " << offset;
      }
    }
  }
}

// A reader keeps at most max_open_files files open (the least recently used closed first), and
// what it reads through files closed and opened again is still the whole read's.
TEST(ShardedCheckpoint, AReaderKeepsAtMostItsOpenFileLimit) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun run = make_run(*model, 0.5);
  const std::string step_dir = dir.file("w5");
  write_sharded(step_dir, *model, run, 5, /*bucketed=*/false, 7);  // each tensor in 5 files
  const auto whole = checkpoint::read_checkpoint(step_dir);
  checkpoint::ShardedReader reader(step_dir, io::read_manifest(step_dir), 2);
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [name, t] : whole.tensors) {
      at::Tensor out = at::empty_like(t);
      reader.read_whole(name, out);
      EXPECT_TRUE(out.equal(t)) << name;
      EXPECT_LE(reader.open_files(), 2u) << name;
    }
  }
}

TEST(ShardedCheckpoint, OpenedRefusesDamageAndCheckCompatibleSaysWhatDiffers) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun older = make_run(*model, 0.1), newer = make_run(*model, 0.2);
  write_sharded(dir.file("step_000010"), *model, older, 2, true, 10);
  write_sharded(dir.file("step_000020"), *model, newer, 2, true, 20);
  {  // a byte of rank 0's file of step 20 flipped
    std::fstream f(dir.file("step_000020/rank_00000.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.write("\x7f", 1);
  }
  std::vector<std::string> skipped;
  checkpoint::Checkpoint ckpt;
  EXPECT_EQ(checkpoint::newest_good_checkpoint(dir.path(), &skipped, &ckpt,
                                               checkpoint::ShardedRead::kOpen),
            dir.file("step_000010"));
  EXPECT_THAT(skipped, ::testing::ElementsAre(HasSubstr("step_000020/rank_00000.safetensors")));
  // Another model: the same message as for a checkpoint read whole.
  models::ModelOptions o;
  o.name = "mlp";
  o.hidden_dim = 8;
  o.depth = 2;
  core::Shape shape;
  shape.input_dim = 5;
  shape.num_classes = 3;
  auto wider = models::create_model(o, shape);
  const auto whole = checkpoint::read_checkpoint(dir.file("step_000010"));
  std::string opened_error, whole_error;
  try {
    checkpoint::check_compatible(ckpt, *wider);
  } catch (const checkpoint::CheckpointError& e) {
    opened_error = e.what();
  }
  try {
    checkpoint::check_compatible(whole, *wider);
  } catch (const checkpoint::CheckpointError& e) {
    whole_error = e.what();
  }
  EXPECT_THAT(opened_error, HasSubstr("in the checkpoint but"));
  EXPECT_EQ(opened_error, whole_error);
}

TEST(ShardedCheckpoint, KeepLastPrunesStepDirectoriesWithFiles) {
  test::TempDir dir;
  auto model = mlp(1);
  const FakeRun run = make_run(*model, 0.1);
  for (int s : {10, 20, 30}) {
    write_sharded(dir.file(io::step_dir_name(s)), *model, run, 2, false, s);
  }
  write_sharded(dir.file("final"), *model, run, 2, false, 30);
  const auto deleted = checkpoint::prune_checkpoints(dir.path(), 1);
  EXPECT_THAT(deleted,
              ::testing::UnorderedElementsAre(dir.file("step_000010"), dir.file("step_000020")));
  EXPECT_FALSE(checkpoint::is_sharded_checkpoint(dir.file("step_000020")));
  EXPECT_NE(::access(dir.file("step_000020").c_str(), F_OK), 0);
  EXPECT_TRUE(checkpoint::is_sharded_checkpoint(dir.file("step_000030")));
  EXPECT_TRUE(checkpoint::is_sharded_checkpoint(dir.file("final")));
}

}  // namespace TRAINER_UNITY_ID
