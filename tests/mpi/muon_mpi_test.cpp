// Muon on W ranks (train/muon.h, Note [Muon on every sharding mode]): under ddp.shard none,
// optimizer, gradients and parameters, W ranks equal one process (MPI_COMM_SELF), gpt and llama
// (its q, k and v rows of qkv_proj three matrices, cut across ranks): to 1e-5 with
// Newton-Schulz in fp32, and within the noise floor with the default bf16, the floor being what
// a mere change of the gradients' rounding (another micro-batch split) moves one process by. Each
// matrix is orthogonalised once per step world-wide, every rank taking a share; the fallback
// rungs that shard a run in place carry the momentum; a checkpoint written by 3 ranks under
// parameters resumes on 2 ranks under none (both formats) as the uninterrupted run goes on.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/gather.h"
#include "memory/allocator_guard.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

const char* const kModes[] = {"none", "optimizer", "gradients", "parameters"};

// gpt: 2 blocks of 32, matrices of 96 x 32, 32 x 32, 128 x 32, 32 x 128.
constexpr const char* kGpt = "{name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}";
// llama: 2 blocks of 32, q_proj 32 x 32, k_proj and v_proj 16 x 32 (rows of one qkv_proj, each a
// matrix of its own), o_proj 32 x 32, gate_proj and up_proj 40 x 32, down_proj 32 x 40.
constexpr const char* kLlama =
    "{name: llama, preset: llama-tiny, num_layers: 2, d_model: 32, heads: 4, kv_heads: 2, "
    "intermediate_size: 40}";

// `model` in buckets small enough that the ranks' blocks cut matrices apart (and llama's
// qkv_proj within and across its q, k and v rows).
std::string yaml(const std::string& shard, const std::string& ns, const std::string& extra = "",
                 int64_t micro = 2, const std::string& model = kGpt) {
  return fmt::format(
      "model: {}\n"
      "data: {{dataset: tokens, path: {}, context: 16, vocab_size: 100, workers: 0}}\n"
      "train: {{device: cpu, global_batch_size: 9, micro_batch_size: {}, steps: 6, lr: 0.01, "
      "warmup_steps: 1, grad_clip: 1.0, seed: 11, optimizer: muon, muon_lr: 0.02, "
      "muon_ns_dtype: {}, threads: 1{}}}\n"
      "ddp: {{shard: {}, first_bucket_mb: 0.002, bucket_mb: 0.02}}\n"
      "memory: {{check_every: 0}}\n"
      "checkpoint: {{format: single}}\n",
      model, trainer_test::token_shard_dir(), micro, ns, extra, shard);
}

struct Trained {
  std::vector<at::Tensor> params, initial;
  std::vector<int64_t> calls;  // per step: this rank's Newton-Schulz runs
};

Trained train(ddp::Communicator& comm, const std::string& text, int64_t steps = 6) {
  trainer_test::CpuRun run = trainer_test::make_cpu_run(comm, text, "muon.yaml");
  Trained t;
  {  // under ddp.shard parameters the units are gathered only while pinned
    const auto pinned = trainer_test::pin_parameters(*run.trainer);
    t.initial = trainer_test::snapshot(*run.model);
  }
  int64_t before = 0;
  for (int64_t s = 1; s <= steps; ++s) {
    run.trainer->step(s);
    t.calls.push_back(trainer_test::muon_newton_schulz_calls(*run.trainer) - before);
    before = trainer_test::muon_newton_schulz_calls(*run.trainer);
  }
  const auto pinned = trainer_test::pin_parameters(*run.trainer);
  t.params = trainer_test::snapshot(*run.model);
  return t;
}

TEST(MuonMpiEquivalence, EveryModeMatchesOneProcessWithNewtonSchulzInFp32) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const Trained one = train(*self, yaml("none", "fp32"));
  EXPECT_GT(relative_error(one.params, one.initial), 1e-2) << "training moved nothing";
  for (const char* mode : kModes) {
    const Trained many = train(*world, yaml(mode, "fp32"));
    const double err = relative_error(many.params, one.params);
    EXPECT_LT(err, 1e-5) << mode << " on " << world->size() << " ranks";
    if (world->rank() == 0) {
      fmt::print("muon fp32, {}: {} ranks vs 1: {:.1e}\n", mode, world->size(), err);
    }
  }
}

TEST(MuonMpiEquivalence, EveryModeMatchesOneProcessWithinTheNoiseFloorInBf16) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const Trained one = train(*self, yaml("none", "auto"));
  // The floor: one process, the same samples, only the gradients' rounding changed.
  const double floor = relative_error(train(*self, yaml("none", "auto", "", 3)).params, one.params);
  for (const char* mode : kModes) {
    const Trained many = train(*world, yaml(mode, "auto"));
    const double err = relative_error(many.params, one.params);
    EXPECT_LT(err, std::max(4 * floor, 1e-5)) << mode << " on " << world->size() << " ranks";
    if (world->rank() == 0) {
      fmt::print("muon bf16, {}: {} ranks vs 1: {:.1e} (noise floor {:.1e})\n", mode, world->size(),
                 err, floor);
    }
  }
}

// llama: q_proj, k_proj and v_proj orthogonalised apart (7 matrices a block, 14 Newton-Schulz
// runs a step world-wide) while the ranks hold slices of the fused qkv_proj.
TEST(MuonMpiEquivalence, LlamaEveryModeMatchesOneProcessWithEachProjectionApart) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const Trained one = train(*self, yaml("none", "fp32", "", 2, kLlama));
  EXPECT_GT(relative_error(one.params, one.initial), 1e-2) << "training moved nothing";
  for (const char* mode : kModes) {
    const Trained many = train(*world, yaml(mode, "fp32", "", 2, kLlama));
    const double err = relative_error(many.params, one.params);
    EXPECT_LT(err, 1e-5) << mode << " on " << world->size() << " ranks";
    at::Tensor calls = at::tensor(many.calls, at::kLong);
    world->all_reduce(calls, ddp::ReduceOp::kSum, "calls");
    EXPECT_EQ(calls.sum().item<int64_t>(), 6 * 14) << mode;
    if (world->rank() == 0) {
      fmt::print("muon llama fp32, {}: {} ranks vs 1: {:.1e}\n", mode, world->size(), err);
    }
  }
}

TEST(MuonMpiNewtonSchulz, OncePerMatrixWorldWideEveryStepAndEveryRankTakesAShare) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  constexpr int64_t kMatrices = 8;  // 2 blocks x 4 projections
  for (const char* mode : kModes) {
    const Trained t = train(*world, yaml(mode, "auto"), 3);
    at::Tensor calls = at::tensor(t.calls, at::kLong);
    const at::Tensor mine = calls.clone();
    world->all_reduce(calls, ddp::ReduceOp::kSum, "calls");
    for (int64_t s = 0; s < 3; ++s) {
      EXPECT_EQ(calls[s].item<int64_t>(), kMatrices) << mode << ", step " << s + 1;
    }
    EXPECT_GT(mine[0].item<int64_t>(), 0) << mode << ": rank " << world->rank() << " ran none";
  }
}

// A step that runs out of memory takes memory.fallback's rung shard_optimizer or
// shard_parameters: the run switches mode in place, with the momentum, and goes on as the run
// that never switched (fp32 Newton-Schulz: to 1e-5).
TEST(MuonMpiFallback, TheRungsThatShardInPlaceCarryTheMomentum) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const Trained straight = train(*world, yaml("none", "fp32"));
  for (const char* rung : {"shard_optimizer", "shard_parameters"}) {
    auto& guard = memory::CpuAllocatorGuard::instance();
    guard.set_injections(world->rank(), memory::parse_injections("0:3:forward"));
    const Trained switched =
        train(*world, yaml("none", "fp32") + fmt::format("memory: {{fallback: [{}]}}\n", rung));
    guard.set_injections(world->rank(), {});
    EXPECT_LT(relative_error(switched.params, straight.params), 1e-5) << rung;
  }
}

// 3 ranks under parameters write a checkpoint after 3 steps; 2 ranks under none resume from it
// to step 6, as the uninterrupted 3-rank run goes on (both formats).
TEST(MuonMpiResume, ThreeRanksUnderParametersToTwoRanksUnderNone) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  if (world->size() != 3) GTEST_SKIP() << "needs 3 ranks (mpi_tests_np3)";
  auto two = trainer_test::all_but_last_rank(*world);
  test::TempDir mine;
  const std::string dir = ddp::all_gather_strings(*world, mine.path())[0];  // rank 0's
  for (const char* format : {"single", "sharded"}) {
    std::string writer = yaml("parameters", "fp32");
    writer.replace(writer.find("format: single"), 14, std::string("format: ") + format);
    const std::string path =
        dir + "/muon_" + format + (std::string(format) == "single" ? ".safetensors" : "");
    const auto straight = trainer_test::train_until(*world, writer, 6, 5, "", "");
    trainer_test::train_until(*world, writer, 3, 5, "", path);
    if (two) {
      const auto resumed = trainer_test::train_until(*two, yaml("none", "fp32"), 6, 99, path, "");
      EXPECT_LT(relative_error(resumed, straight), 1e-5) << format;
    }
    world->barrier("resumed");
  }
  world->barrier("done with rank 0's directory");
}

}  // namespace TRAINER_UNITY_ID
