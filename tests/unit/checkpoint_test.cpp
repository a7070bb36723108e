// Checkpoint files (checkpoint/single_file.h, read.h, files.h): what a run writes is what a resume
// reads; a file for another model, a file that is not a checkpoint and a missing file are errors
// naming the file and the tensor; `auto` finds the checkpoint with the most steps.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "models/capabilities.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

std::shared_ptr<models::Model> mlp(int64_t hidden, uint64_t seed) {
  at::manual_seed(seed);
  models::ModelOptions o;
  o.name = "mlp";
  o.hidden_dim = hidden;
  o.depth = 2;
  core::Shape shape;
  shape.input_dim = 6;
  shape.num_classes = 3;
  return models::create_model(o, shape);
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> moments(models::Model& m, double fill) {
  std::vector<at::Tensor> a, v;
  for (const auto& p : m.parameters()) {
    a.push_back(at::full_like(p, fill));
    v.push_back(at::full_like(p, fill * fill));
  }
  return {a, v};
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const checkpoint::CheckpointError& e) {
    return e.what();
  }
  return "";
}

// A checkpoint's metadata: steps done, global batch, seed and world size; the rest empty. Named
// fields, as an aggregate's braces leave the later members to -Wmissing-field-initializers.
checkpoint::CheckpointMeta meta_of(int64_t step, int64_t global_batch_size, uint64_t seed,
                                   int world_size) {
  checkpoint::CheckpointMeta meta;
  meta.step = step;
  meta.global_batch_size = global_batch_size;
  meta.seed = seed;
  meta.world_size = world_size;
  return meta;
}

// Writes a checkpoint of `model` with moments filled with `fill` and `fill`^2 to `path`.
void write(const std::string& path, models::Model& model, double fill,
           checkpoint::CheckpointMeta meta) {
  const auto [m, v] = moments(model, fill);
  checkpoint::write_checkpoint(path, model, m, v, meta);
}

TEST(Checkpoint, WhatIsWrittenIsWhatIsRead) {
  test::TempDir dir;
  auto written = mlp(8, 1);
  const std::string path = dir.file("step_000007.safetensors");
  write(path, *written, 0.25, meta_of(7, 96, 42, 3));
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0) << "the temporary file was left behind";

  const auto ckpt = checkpoint::read_checkpoint(path);
  EXPECT_EQ(ckpt.meta.step, 7);
  EXPECT_EQ(ckpt.meta.global_batch_size, 96);
  EXPECT_EQ(ckpt.meta.seed, 42u);
  EXPECT_EQ(ckpt.meta.world_size, 3);
  auto resumed = mlp(8, 2);  // other weights, same architecture
  EXPECT_EQ(error_of([&] { checkpoint::check_compatible(ckpt, *resumed); }), "");
  checkpoint::apply_model_state(ckpt, *resumed);
  const auto a = written->named_parameters();
  const auto b = resumed->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(item.value().equal(*b.find(item.key()))) << item.key();
  const auto first = a.begin()->key();
  EXPECT_TRUE(
      ckpt.tensors.at("adamw.exp_avg_sq." + first).equal(at::full_like(*a.find(first), 0.0625)));
}

TEST(Checkpoint, AnotherModelIsAnErrorNamingTheTensorAndShapes) {
  test::TempDir dir;
  auto written = mlp(8, 1);
  const std::string path = dir.file("final.safetensors");
  write(path, *written, 0.1, meta_of(3, 16, 1, 1));
  const auto ckpt = checkpoint::read_checkpoint(path);
  auto wider = mlp(16, 1);
  const std::string message = error_of([&] { checkpoint::check_compatible(ckpt, *wider); });
  EXPECT_THAT(message, HasSubstr(path + ": 'param.hidden.0.weight' is [8, 6] Float in the "
                                        "checkpoint but [16, 6] Float in the model"))
      << message;
  models::ModelOptions deeper_options;
  deeper_options.name = "mlp";
  deeper_options.hidden_dim = 8;
  deeper_options.depth = 3;
  core::Shape shape;
  shape.input_dim = 6;
  shape.num_classes = 3;
  auto deeper = models::create_model(deeper_options, shape);
  EXPECT_THAT(
      error_of([&] { checkpoint::check_compatible(ckpt, *deeper); }),
      HasSubstr("the model has 'param.hidden.2.weight' ([8, 8] Float), the checkpoint does not"));
}

TEST(Checkpoint, MissingFilesAndOtherSafetensorsAreErrorsNamingTheFile) {
  test::TempDir dir;
  EXPECT_THAT(error_of([&] { checkpoint::read_checkpoint(dir.file("nope.safetensors")); }),
              HasSubstr(dir.file("nope.safetensors")));
  const std::string weights = dir.file("weights.safetensors");
  io::write_safetensors(weights, {{"w", at::ones({2})}});
  EXPECT_THAT(error_of([&] { checkpoint::read_checkpoint(weights); }),
              HasSubstr(weights + ": not a trainer checkpoint"));
}

TEST(Checkpoint, LatestIsTheOneWithTheMostStepsAndSkipsOthers) {
  test::TempDir dir;
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path()), "");
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.file("absent")), "");
  auto model = mlp(4, 1);
  write(dir.file("step_000020.safetensors"), *model, 0, meta_of(20, 8, 1, 1));
  write(dir.file("step_000100.safetensors"), *model, 0, meta_of(100, 8, 1, 1));
  write(dir.file("oom_step_000051.safetensors"), *model, 0, meta_of(50, 8, 1, 1));
  io::write_safetensors(dir.file("weights.safetensors"), {{"w", at::ones({2})}});
  std::ofstream(dir.file("torn.safetensors")) << "garbage";
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path()), dir.file("step_000100.safetensors"));
}

TEST(Checkpoint, EmbeddingCachesAreLeftOut) {
  test::TempDir dir;
  models::ModelOptions o;
  o.name = "recommender";
  o.hidden_dim = 8;
  o.depth = 1;
  o.embedding_dim = 8;
  o.encoder_dim = 8;
  o.encoder_layers = 1;
  o.encoder_heads = 2;
  core::Shape shape;
  shape.num_users = 5;
  shape.num_items = 7;
  shape.item_text = at::randint(1, 200, {7, 6}, at::kLong);
  auto cached = models::create_model(o, shape);
  models::as<models::EmbeddingCache>(*cached)->build_cache();
  ASSERT_TRUE(models::has_cache(*cached));
  const std::string path = dir.file("final.safetensors");
  write(path, *cached, 0, meta_of(1, 8, 1, 1));
  const auto ckpt = checkpoint::read_checkpoint(path);
  EXPECT_FALSE(ckpt.tensors.count("buffer.item_cache"));
  EXPECT_TRUE(ckpt.tensors.count("buffer.item_text"));
  auto fresh = models::create_model(o, shape);  // no cache built yet
  EXPECT_EQ(error_of([&] { checkpoint::check_compatible(ckpt, *fresh); }), "");
}

}  // namespace TRAINER_UNITY_ID

namespace TRAINER_UNITY_ID {

// Overwrites `n` bytes at `offset` of `path` (from the end when offset < 0), or truncates it.
void damage(const std::string& path, int64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset, offset < 0 ? std::ios::end : std::ios::beg);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void truncate_to(const std::string& path, int64_t size) {
  ASSERT_EQ(::truncate(path.c_str(), size), 0);
}

TEST(CheckpointIntegrity, AFlippedByteATruncationAndAnEmptyFileAreRefusedByName) {
  test::TempDir dir;
  auto model = mlp(8, 1);
  const std::string flipped = dir.file("step_000001.safetensors"),
                    cut = dir.file("step_000002.safetensors"),
                    empty = dir.file("step_000003.safetensors");
  for (const auto& p : {flipped, cut, empty}) write(p, *model, 0.5, meta_of(1, 96, 42, 2));
  EXPECT_NO_THROW(checkpoint::read_checkpoint(flipped));
  damage(flipped, -3, "\x7f");  // in the last tensor's data
  truncate_to(cut, 500);
  truncate_to(empty, 0);
  for (const auto& p : {flipped, cut, empty}) {
    try {
      checkpoint::read_checkpoint(p);
      ADD_FAILURE() << p << " was read";
    } catch (const checkpoint::CheckpointDamaged& e) {
      EXPECT_THAT(e.what(), HasSubstr(p));
    }
  }
  EXPECT_THAT(error_of([&] { checkpoint::read_checkpoint(flipped); }),
              HasSubstr("corrupt: the tensor data's checksum is crc32:"));
}

TEST(CheckpointIntegrity, AutoPassesOverDamagedCheckpointsToTheNewestGoodOne) {
  test::TempDir dir;
  auto model = mlp(8, 1);
  write(dir.file("step_000010.safetensors"), *model, 0.1, meta_of(10, 96, 42, 2));
  write(dir.file("step_000020.safetensors"), *model, 0.2, meta_of(20, 96, 42, 2));
  write(dir.file("final.safetensors"), *model, 0.3, meta_of(30, 96, 42, 2));
  damage(dir.file("final.safetensors"), -1, "\x01");
  truncate_to(dir.file("step_000020.safetensors"), 100);
  std::vector<std::string> skipped;
  checkpoint::Checkpoint ckpt;
  EXPECT_EQ(checkpoint::newest_good_checkpoint(dir.path(), &skipped, &ckpt),
            dir.file("step_000010.safetensors"));
  EXPECT_EQ(ckpt.meta.step, 10);
  EXPECT_THAT(skipped, ::testing::UnorderedElementsAre(HasSubstr("final.safetensors: corrupt"),
                                                       HasSubstr("step_000020.safetensors")));
}

TEST(CheckpointIntegrity, KeepLastDeletesOnlyOlderPeriodicCheckpoints) {
  test::TempDir dir;
  auto model = mlp(8, 1);
  for (int s : {10, 20, 30, 40})
    write(dir.file(fmt::format("step_{:06d}.safetensors", s)), *model, 0.1, meta_of(s, 96, 42, 2));
  write(dir.file("final.safetensors"), *model, 0.1, meta_of(40, 96, 42, 2));
  write(dir.file("oom_step_000005.safetensors"), *model, 0.1, meta_of(4, 96, 42, 2));
  const auto deleted = checkpoint::prune_checkpoints(dir.path(), 2);
  EXPECT_THAT(deleted, ::testing::UnorderedElementsAre(dir.file("step_000010.safetensors"),
                                                       dir.file("step_000020.safetensors")));
  for (const char* kept : {"step_000030.safetensors", "step_000040.safetensors",
                           "final.safetensors", "oom_step_000005.safetensors"}) {
    EXPECT_EQ(::access(dir.file(kept).c_str(), F_OK), 0) << kept;
  }
  EXPECT_TRUE(checkpoint::prune_checkpoints(dir.path(), 0).empty());
}

TEST(CheckpointIntegrity, TheConfigurationTravelsInTheMetadata) {
  test::TempDir dir;
  auto model = mlp(8, 1);
  checkpoint::CheckpointMeta meta = meta_of(3, 96, 42, 2);
  meta.config = "model:\n  name: mlp\n";
  write(dir.file("c.safetensors"), *model, 0.1, meta);
  EXPECT_EQ(checkpoint::read_checkpoint(dir.file("c.safetensors")).meta.config,
            "model:\n  name: mlp\n");
}

}  // namespace TRAINER_UNITY_ID
