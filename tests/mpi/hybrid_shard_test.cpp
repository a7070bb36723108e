// ddp.shard_group: node (hybrid sharding) on 2 simulated nodes x 2 ranks (ctest
// mpi_tests_hybrid_np4: mpirun -np 4 with TRAINER_TEST_RANKS_PER_NODE=2; skipped elsewhere):
// - optimizer, gradients and parameters sharded within each node and replicated across nodes give
//   the parameters and the gradient norms of ddp.shard: none on the same 4 ranks within 1e-6
//   (fp32; gpt with clipping, the MLP with an uneven batch and micro-batches), the same on every
//   rank; the norm is summed over the world and divided by the nodes (not dividing would count
//   every shard twice), with the spike guard or without;
// - per-rank optimizer state is 1/node_size of the unsharded one, not 1/world, and so is the
//   plan's (Trainer::footprint: the check before step 1 and --dry-run's per-rank state);
// - a hybrid run's checkpoint, the single file or sharded (one file per rank of a node, written by
//   the first node's ranks), resumes under ddp.shard: none and under hybrid sharding (and a plain
//   checkpoint resumes hybrid), equal to the run without a break.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/mpi_test_env.h"
#include "common/trainer_seam.h"
#include "ddp/gather.h"

namespace TRAINER_UNITY_ID {

using trainer_test::expect_same_on_every_rank;
using trainer_test::relative_error;
using trainer_test::snapshot;

// The world and the two hybrid communicators; skips unless the ranks form 2+ simulated nodes of
// 2+ ranks each.
class HybridShard : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& t = trainer_test::runtime().topology();
    if (t.num_nodes < 2 || t.node_size < 2 || !t.uniform_nodes) {
      GTEST_SKIP() << "needs 2+ nodes of 2+ ranks (TRAINER_TEST_RANKS_PER_NODE)";
    }
    world_ = trainer_test::runtime().world(std::chrono::seconds(60));
    node_ = trainer_test::runtime().node(std::chrono::seconds(60));
    cross_ = trainer_test::runtime().cross_node(std::chrono::seconds(60));
  }
  train::HybridComms hybrid() const { return {node_.get(), cross_.get()}; }

  std::unique_ptr<ddp::Communicator> world_, node_, cross_;
};

struct Trained {
  std::vector<at::Tensor> params;
  std::vector<train::StepResult> results;
  int64_t optimizer_state = 0;
  int64_t planned_optimizer_state = 0;  // Trainer::footprint: the plan before step 1, --dry-run
};

Trained train(ddp::Communicator& world, const std::string& yaml, int64_t steps,
              train::HybridComms hybrid) {
  auto run = trainer_test::make_cpu_run(world, yaml, "hybrid.yaml", hybrid);
  Trained t;
  for (int64_t s = 1; s <= steps; ++s) t.results.push_back(run.trainer->step(s));
  const auto pinned = trainer_test::pin_parameters(*run.trainer);
  t.params = snapshot(*run.model);
  t.optimizer_state = run.trainer->memory_estimate().optimizer_state;
  t.planned_optimizer_state = run.trainer->footprint(run.trainer->shard_mode()).optimizer_state;
  return t;
}

std::string mlp_yaml() {
  return "model: {name: mlp, hidden_dim: 48, depth: 2}\n"
         "data: {num_samples: 2000, input_dim: 12, num_classes: 5, teacher_hidden: 16, seed: 7}\n"
         "train: {device: cpu, global_batch_size: 13, micro_batch_size: 2, steps: 20, lr: 0.01, "
         "warmup_steps: 3, grad_clip: 0.05, seed: 11}\n"
         "memory: {check_every: 0}\n";
}

std::string gpt_yaml() {
  return "model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n"
         "data: {dataset: tokens, path: " +
         trainer_test::token_shard_dir() +
         ", context: 16, vocab_size: 100}\n"
         "train: {device: cpu, global_batch_size: 9, micro_batch_size: 2, steps: 5, lr: 0.003, "
         "warmup_steps: 1, seed: 11, grad_clip: 0.5}\n"
         "memory: {check_every: 0}\n";
}

void expect_hybrid_equals_none(ddp::Communicator& world, train::HybridComms hybrid,
                               const std::string& name, const std::string& yaml, int64_t steps) {
  const std::string buckets = ", first_bucket_mb: 0.001, bucket_mb: 0.003";
  const Trained none = train(world, yaml + "ddp: {shard: none" + buckets + "}\n", steps, {});
  for (const char* shard : {"optimizer", "gradients", "parameters"}) {
    const Trained hyb = train(
        world, yaml + fmt::format("ddp: {{shard: {}, shard_group: node{}}}\n", shard, buckets),
        steps, hybrid);
    const double err = relative_error(hyb.params, none.params);
    EXPECT_LT(err, 1e-6) << name << " " << shard;
    expect_same_on_every_rank(world, hyb.params);
    for (size_t s = 0; s < none.results.size(); ++s) {
      EXPECT_NEAR(hyb.results[s].grad_norm, none.results[s].grad_norm,
                  1e-5 * none.results[s].grad_norm)
          << name << " " << shard << " step " << s + 1;
    }
    // AdamW's moments: 1/node_size of the unsharded ones (buckets padded to the node size).
    const double share = static_cast<double>(hyb.optimizer_state) / none.optimizer_state;
    EXPECT_NEAR(share, 1.0 / hybrid.node->size(), 0.05) << name << " " << shard;
    // The plan (the check before step 1, --dry-run's per-rank state) divides by the node too.
    EXPECT_EQ(hyb.planned_optimizer_state, hyb.optimizer_state) << name << " " << shard;
    if (world.rank() == 0) {
      fmt::print("hybrid {} {} on {} nodes x {}: relative error {:.2e}, optimizer state {:.3f}\n",
                 name, shard, hybrid.cross_node->size(), hybrid.node->size(), err, share);
    }
  }
}

TEST_F(HybridShard, EveryModeEqualsUnshardedOnTheMlp) {
  expect_hybrid_equals_none(*world_, hybrid(), "mlp", mlp_yaml(), 20);
}

TEST_F(HybridShard, EveryModeEqualsUnshardedOnGpt) {
  expect_hybrid_equals_none(*world_, hybrid(), "gpt", gpt_yaml(), 5);
}

// The spike guard under hybrid sharding: its clipper sums the squares over the world, divided by
// the replicas, so that the loss riding with them is the world's; the norms stay those of
// ddp.shard: none, and the injected spike at step 6 is skipped on every rank.
TEST_F(HybridShard, SpikeGuardKeepsTheNormAndSkipsTheSpike) {
  const std::string base = mlp_yaml();
  const std::string seed = "seed: 11}";
  const size_t at = base.find(seed);
  const std::string guarded = base.substr(0, at) +
                              "seed: 11, skip_spikes: {loss_z: 50, grad_norm_z: 0, window: 3}, "
                              "inject_spike: '6'}" +
                              base.substr(at + seed.size());
  const Trained none = train(*world_, mlp_yaml() + "ddp: {shard: none}\n", 8, {});
  for (const char* shard : {"gradients", "parameters"}) {
    const Trained hyb =
        train(*world_, guarded + fmt::format("ddp: {{shard: {}, shard_group: node}}\n", shard), 8,
              hybrid());
    for (size_t s = 0; s < 8; ++s) {
      EXPECT_EQ(hyb.results[s].skipped, s == 5) << shard << " step " << s + 1;
      if (s < 5) {
        EXPECT_NEAR(hyb.results[s].grad_norm, none.results[s].grad_norm,
                    1e-5 * none.results[s].grad_norm)
            << shard << " step " << s + 1;
      }
    }
    expect_same_on_every_rank(*world_, hyb.params);
  }
}

// Hybrid `gradients` for 6 steps -> none for 6 (and none -> hybrid `parameters`):
// checkpoint.format: single (rank 0 gathers within its node), equal to 12 steps without a break.
TEST_F(HybridShard, CheckpointResumesUnshardedAndBack) {
  using trainer_test::train_until;
  const std::string dir =
      ddp::all_gather_strings(*world_, fmt::format("/tmp/trainer_hybrid_resume_{}", ::getpid()))[0];
  const std::string yaml = mlp_yaml() + "checkpoint: {format: single}\n";
  const auto ddp = [](const char* rest) { return fmt::format("ddp: {{{}}}\n", rest); };
  const auto straight = train_until(*world_, yaml + ddp("shard: none"), 12, 1, "", "");

  const std::string hybrid_half = dir + "_hybrid.safetensors";
  train_until(*world_, yaml + ddp("shard: gradients, shard_group: node"), 6, 1, "", hybrid_half,
              hybrid());
  const auto from_hybrid = train_until(*world_, yaml + ddp("shard: none"), 12, 77, hybrid_half, "");
  EXPECT_LT(relative_error(from_hybrid, straight), 1e-6) << "node -> none";

  const std::string plain_half = dir + "_plain.safetensors";
  train_until(*world_, yaml + ddp("shard: none"), 6, 1, "", plain_half);
  const auto into_hybrid = train_until(*world_, yaml + ddp("shard: parameters, shard_group: node"),
                                       12, 77, plain_half, "", hybrid());
  EXPECT_LT(relative_error(into_hybrid, straight), 1e-6) << "none -> node";
  if (world_->rank() == 0) {
    EXPECT_EQ(checkpoint::read_checkpoint(hybrid_half).meta.world_size, world_->size());
    fmt::print("hybrid resume: node -> none {:.2e}, none -> node {:.2e}\n",
               relative_error(from_hybrid, straight), relative_error(into_hybrid, straight));
  }
  world_->barrier("cleanup");
  if (world_->rank() == 0) {
    ::unlink(hybrid_half.c_str());
    ::unlink(plain_half.c_str());
  }
}

// checkpoint.format: sharded under hybrid sharding: the first node's ranks write one file each
// (every node holds the same blocks). Hybrid gradients -> none on the world, hybrid parameters ->
// hybrid optimizer, and a plain 4-rank sharded checkpoint -> hybrid parameters, each 6 + 6 steps,
// equal to 12 steps without a break.
TEST_F(HybridShard, ShardedCheckpointHasOneFilePerNodeRankAndResumesAnywhere) {
  using trainer_test::train_until;
  const std::string dir = ddp::all_gather_strings(
      *world_, fmt::format("/tmp/trainer_hybrid_sharded_{}", ::getpid()))[0];
  const std::string yaml = mlp_yaml() + "checkpoint: {format: sharded}\n";
  const auto ddp = [](const char* rest) { return fmt::format("ddp: {{{}}}\n", rest); };
  const auto straight = train_until(*world_, yaml + ddp("shard: none"), 12, 1, "", "");
  struct Case {
    const char* name;
    const char* first;
    bool first_hybrid;
    const char* second;
    bool second_hybrid;
  };
  const Case cases[] = {
      {"node gradients -> none", "shard: gradients, shard_group: node", true, "shard: none", false},
      {"node parameters -> node optimizer", "shard: parameters, shard_group: node", true,
       "shard: optimizer, shard_group: node", true},
      {"world optimizer -> node parameters", "shard: optimizer", false,
       "shard: parameters, shard_group: node", true}};
  int i = 0;
  for (const Case& c : cases) {
    const std::string half = fmt::format("{}_{}", dir, i++);  // the step directory
    train_until(*world_, yaml + ddp(c.first), 6, 1, "", half + ".safetensors",
                c.first_hybrid ? hybrid() : train::HybridComms{});
    const auto resumed = train_until(*world_, yaml + ddp(c.second), 12, 77, half, "",
                                     c.second_hybrid ? hybrid() : train::HybridComms{});
    EXPECT_LT(relative_error(resumed, straight), 1e-6) << c.name;
    if (world_->rank() == 0) {
      const io::ShardManifest m = io::read_manifest(half);
      EXPECT_EQ(m.world_size, world_->size()) << c.name;
      EXPECT_EQ(static_cast<int>(m.files.size()), c.first_hybrid ? node_->size() : world_->size())
          << c.name;
      fmt::print("hybrid sharded checkpoint {}: {} files, relative error {:.2e}\n", c.name,
                 m.files.size(), relative_error(resumed, straight));
    }
    world_->barrier("cleanup");
    if (world_->rank() == 0) checkpoint::remove_step_dir(half);
  }
}

}  // namespace TRAINER_UNITY_ID
