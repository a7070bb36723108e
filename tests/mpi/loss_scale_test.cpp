// fp16 loss scaling that every rank agrees on (train/loss_scaler.h): an inf injected into one
// rank's gradient makes every rank skip the same step with parameters unchanged and the scale
// backed off; training then goes on; without injections the scale grows as configured. In fp32
// (no loss scaling) a non-finite gradient norm is skipped and counted by the same mechanism.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::expect_same_on_every_rank;
using trainer_test::relative_error;
using trainer_test::snapshot;

using Run16 = trainer_test::CpuRun;

Run16 make(ddp::Communicator& comm, const std::string& extra,
           const std::string& precision = "precision: fp16, loss_scale: 1024") {
  return trainer_test::make_cpu_run(
      comm,
      "model: {name: mlp, hidden_dim: 32, depth: 2}\n"
      "data: {num_samples: 1000, input_dim: 8, num_classes: 4, teacher_hidden: 8, seed: 7}\n"
      "train: {device: cpu, global_batch_size: 13, micro_batch_size: 3, steps: 10, lr: 0.01,\n"
      "        warmup_steps: 1, seed: 11, " +
          precision + ", loss_scale_interval: 3" + extra + "}\n",
      "loss-scale.yaml");
}

TEST(LossScale, NonFiniteOnOneRankSkipsTheStepOnEveryRank) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const int last = world->size() - 1;
  // The last rank's gradient is infinite at step 4.
  Run16 s = make(*world, fmt::format(", inject_nonfinite: '{}:4'", last));
  for (int64_t step = 1; step <= 3; ++step) {
    const auto r = s.trainer->step(step);
    EXPECT_FALSE(r.skipped) << "step " << step;
  }
  const auto before = snapshot(*s.model);
  const auto r4 = s.trainer->step(4);
  EXPECT_TRUE(r4.skipped);
  // Three finite steps grew 1024 to 2048; the non-finite one backs off to 1024.
  EXPECT_EQ(r4.loss_scale, 1024.0);
  EXPECT_EQ(relative_error(snapshot(*s.model), before), 0.0) << "a skipped step changed parameters";
  const auto r5 = s.trainer->step(5);
  EXPECT_FALSE(r5.skipped);
  EXPECT_GT(relative_error(snapshot(*s.model), before), 0.0) << "training did not go on";
  EXPECT_TRUE(std::isfinite(r5.loss));
  expect_same_on_every_rank(*world, snapshot(*s.model));
}

TEST(LossScale, GrowsEveryIntervalWithoutOverflow) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  Run16 s = make(*world, "");
  double scale = 0;
  for (int64_t step = 1; step <= 9; ++step) {
    const auto r = s.trainer->step(step);
    EXPECT_FALSE(r.skipped);
    scale = r.loss_scale;
  }
  EXPECT_EQ(scale, 1024.0 * 8);  // grown after steps 3, 6 and 9
}

// Two non-finite steps in a row with train.max_skipped_steps: 2 end every rank at step 3 with
// NonFiniteFatal naming the key; `precision` is make()'s (fp16 when empty).
void expect_stop_after_two_skips(ddp::Communicator& world, const std::string& precision) {
  Run16 s = precision.empty()
                ? make(world, ", max_skipped_steps: 2, inject_nonfinite: '0:2; 0:3'")
                : make(world, ", max_skipped_steps: 2, inject_nonfinite: '0:2; 0:3'", precision);
  s.trainer->step(1);
  EXPECT_TRUE(s.trainer->step(2).skipped);
  try {
    s.trainer->step(3);
    ADD_FAILURE() << "no error after 2 skipped steps in a row";
  } catch (const train::NonFiniteFatal& e) {
    EXPECT_NE(std::string(e.what()).find("train.max_skipped_steps = 2"), std::string::npos)
        << e.what();
  }
}

TEST(LossScale, TooManySkipsInARowEndEveryRankWithAMessage) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  expect_stop_after_two_skips(*world, "");
}

TEST(LossScale, Fp32NonFiniteOnOneRankSkipsTheStepOnEveryRank) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const int last = world->size() - 1;
  Run16 s = make(*world, fmt::format(", inject_nonfinite: '{}:2'", last), "precision: fp32");
  EXPECT_FALSE(s.trainer->step(1).skipped);
  const auto before = snapshot(*s.model);
  const auto r2 = s.trainer->step(2);
  EXPECT_TRUE(r2.skipped);
  EXPECT_EQ(r2.loss_scale, 0.0) << "fp32 has no loss scale: the test must run fp32";
  EXPECT_EQ(relative_error(snapshot(*s.model), before), 0.0) << "a skipped step changed parameters";
  EXPECT_EQ(s.trainer->skipped_steps(), 1);
  const auto r3 = s.trainer->step(3);
  EXPECT_FALSE(r3.skipped);
  EXPECT_TRUE(std::isfinite(r3.loss));
  EXPECT_GT(relative_error(snapshot(*s.model), before), 0.0) << "training did not go on";
  expect_same_on_every_rank(*world, snapshot(*s.model));
}

TEST(LossScale, Fp32TooManySkipsInARowEndEveryRankWithAMessage) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  expect_stop_after_two_skips(*world, "precision: fp32");
}

}  // namespace TRAINER_UNITY_ID
