// The loss-spike guard across ranks (train.skip_spikes, train/spike_guard.h): an injected spike
// (train.inject_spike) is skipped on every rank, leaving the parameters of a run that stopped
// before it; without spikes the guard changes nothing, bitwise; spikes in a row past
// train.max_skipped_steps end every rank. In fp32 and bf16, with replicated gradients (the global
// loss rides in the first bucket's all-reduce) and sharded ones (it rides with the norm).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "common/mpi_test_env.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::expect_same_on_every_rank;
using trainer_test::relative_error;
using trainer_test::snapshot;

// (precision, ddp.shard)
using Mode = std::tuple<std::string, std::string>;

trainer_test::CpuRun make(ddp::Communicator& comm, const Mode& mode, const std::string& train,
                          int64_t steps) {
  return trainer_test::make_cpu_run(
      comm,
      fmt::format("model: {{name: mlp, hidden_dim: 32, depth: 2}}\n"
                  "data: {{num_samples: 1000, input_dim: 8, num_classes: 4, teacher_hidden: 8, "
                  "seed: 7}}\n"
                  "train: {{device: cpu, global_batch_size: 13, micro_batch_size: 3, steps: {}, "
                  "lr: 0.01, warmup_steps: 1, seed: 11, precision: {}{}}}\n"
                  "ddp: {{shard: {}}}\n",
                  steps, std::get<0>(mode), train, std::get<1>(mode)),
      "spike.yaml");
}

// A short window fills before the spike; over so few steps early in training the gradient norm
// moves by up to ~15 deviations of its own (seen), so the thresholds sit far above that and far
// below the injected spike (x1000: ~1e4 deviations).
const std::string kGuard = ", skip_spikes: {loss_z: 50, grad_norm_z: 50, window: 3}";

class SpikeGuardMpi : public ::testing::TestWithParam<Mode> {};

TEST_P(SpikeGuardMpi, InjectedSpikeLeavesTheParametersOfARunThatStoppedBefore) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto spiked = make(*world, GetParam(), kGuard + ", inject_spike: '6'", 8);
  auto stopped = make(*world, GetParam(), kGuard, 8);  // the same schedule, stopped at 5
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_FALSE(spiked.trainer->step(step).skipped) << "step " << step;
    stopped.trainer->step(step);
  }
  const auto r6 = spiked.trainer->step(6);
  EXPECT_TRUE(r6.skipped);
  EXPECT_GT(r6.loss, 100.0) << "the injected spike did not reach the loss";
  EXPECT_EQ(spiked.trainer->skipped_steps(), 1);
  EXPECT_EQ(relative_error(snapshot(*spiked.model), snapshot(*stopped.model)), 0.0)
      << "the skipped step changed the parameters";
  const auto r7 = spiked.trainer->step(7);
  EXPECT_FALSE(r7.skipped) << "the step after the spike was skipped too";
  EXPECT_LT(r7.loss, 10.0);
  EXPECT_GT(relative_error(snapshot(*spiked.model), snapshot(*stopped.model)), 0.0)
      << "training did not go on after the spike";
  expect_same_on_every_rank(*world, snapshot(*spiked.model));
}

TEST_P(SpikeGuardMpi, ChangesNothingWithoutSpikes) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto guarded = make(*world, GetParam(), kGuard, 10);
  auto plain = make(*world, GetParam(), "", 10);
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_FALSE(guarded.trainer->step(step).skipped) << "step " << step;
    plain.trainer->step(step);
  }
  EXPECT_EQ(relative_error(snapshot(*guarded.model), snapshot(*plain.model)), 0.0);
}

TEST_P(SpikeGuardMpi, SpikesInARowPastTheLimitEndEveryRank) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto s = make(*world, GetParam(), kGuard + ", inject_spike: '5; 6', max_skipped_steps: 2", 8);
  for (int64_t step = 1; step <= 4; ++step) s.trainer->step(step);
  EXPECT_TRUE(s.trainer->step(5).skipped);
  try {
    s.trainer->step(6);
    ADD_FAILURE() << "no error after 2 spikes in a row";
  } catch (const train::NonFiniteFatal& e) {
    EXPECT_NE(std::string(e.what()).find("were skipped as spikes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.max_skipped_steps = 2"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SpikeGuardMpi,
                         ::testing::Values(Mode{"fp32", "none"}, Mode{"bf16", "none"},
                                           Mode{"fp32", "gradients"}, Mode{"bf16", "gradients"}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// One judge only: a spike in the loss alone (the gradient norm unjudged) is still caught, which
// needs the global loss to arrive (replicated: the bucket's rider; sharded: the clipper's).
class SpikeGuardMpiLossOnly : public ::testing::TestWithParam<std::string> {};

TEST_P(SpikeGuardMpiLossOnly, LossAloneCatchesTheSpike) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto s = make(*world, {"fp32", GetParam()},
                ", skip_spikes: {loss_z: 50, grad_norm_z: 0, window: 3}, inject_spike: '5'", 6);
  for (int64_t step = 1; step <= 4; ++step) s.trainer->step(step);
  EXPECT_TRUE(s.trainer->step(5).skipped);
  EXPECT_FALSE(s.trainer->step(6).skipped);
}

INSTANTIATE_TEST_SUITE_P(Shards, SpikeGuardMpiLossOnly,
                         ::testing::Values("none", "optimizer", "gradients", "parameters"));

}  // namespace TRAINER_UNITY_ID
