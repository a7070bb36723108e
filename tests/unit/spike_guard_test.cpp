// SpikeGuard (train/spike_guard.h) on values fed by hand: the z-score against the window of
// applied steps, the warm-up, skipped values kept out of the window, non-finite losses, and the
// test hook's parser.
#include "train/spike_guard.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace TRAINER_UNITY_ID {

struct Guard {
  train::SpikeGuard guard;
  explicit Guard(double loss_z, double norm_z, int64_t window)
      : guard({loss_z, norm_z, window}, c10::Device(c10::kCPU)) {}
  // Judges one step and records it as the trainer does (skipped where spiked, or `skip`).
  bool step(double loss, double norm, bool skip = false) {
    guard.judge(at::tensor({static_cast<float>(loss)}), at::tensor(static_cast<float>(norm)));
    const bool spike = guard.spike().item<float>() > 0;
    guard.record(at::tensor({spike || skip ? 1.0f : 0.0f}));
    return spike;
  }
};

TEST(SpikeGuard, NothingIsASpikeWhileTheWindowFills) {
  Guard g(6, 6, 4);
  EXPECT_FALSE(g.step(1.0, 1.0));
  EXPECT_FALSE(g.step(1.1, 1.0));
  EXPECT_FALSE(g.step(500.0, 500.0));  // third of four: still filling
}

TEST(SpikeGuard, AValueMoreThanZDeviationsAboveTheMeanIsASpike) {
  // Window 1.0, 1.1, 0.9, 1.0: mean 1.0, population deviation sqrt(0.005) = 0.0707.
  Guard g(6, 0, 4);
  for (double v : {1.0, 1.1, 0.9, 1.0}) EXPECT_FALSE(g.step(v, 1.0));
  EXPECT_FALSE(g.step(1.0 + 5.9 * 0.0707107, 1.0));  // 5.9 deviations: applied, enters
  Guard h(6, 0, 4);
  for (double v : {1.0, 1.1, 0.9, 1.0}) h.step(v, 1.0);
  EXPECT_TRUE(h.step(1.0 + 6.1 * 0.0707107, 1.0));
  EXPECT_FALSE(h.step(0.2, 1.0)) << "far below the mean is no spike (one-sided)";
}

TEST(SpikeGuard, TheNormIsJudgedByItsOwnZ) {
  Guard g(0, 3, 3);
  for (double v : {2.0, 2.2, 1.8}) EXPECT_FALSE(g.step(1.0, v));
  EXPECT_FALSE(g.step(1000.0, 2.0)) << "loss_z 0: the loss is not judged";
  EXPECT_TRUE(g.step(1.0, 2.0 + 3.5 * 0.1633));
}

TEST(SpikeGuard, SkippedStepsStayOutOfTheWindow) {
  Guard g(6, 0, 3);
  for (double v : {1.0, 1.1, 0.9}) g.step(v, 1.0);
  // The same spike again and again: had it entered the window, the mean would have followed it.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(g.step(50.0, 1.0)) << "repeat " << i;
  // A step skipped for another reason (inf/NaN) does not enter either.
  EXPECT_FALSE(g.step(1.05, 1.0, /*skip=*/true));
  EXPECT_TRUE(g.step(50.0, 1.0));
}

TEST(SpikeGuard, TheWindowMovesWithTheAppliedSteps) {
  Guard g(6, 0, 3);
  for (double v : {1.0, 1.1, 0.9}) g.step(v, 1.0);
  EXPECT_TRUE(g.step(3.0, 1.0));
  // The loss rises slowly: each step within the window's spread, the window following it.
  for (double v : {1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7}) EXPECT_FALSE(g.step(v, 1.0)) << v;
  EXPECT_FALSE(g.step(1.6 + 5 * 0.0816, 1.0));
}

TEST(SpikeGuard, ANonFiniteLossIsRejectedFromTheFirstStep) {
  Guard g(6, 6, 100);
  EXPECT_TRUE(g.step(std::numeric_limits<double>::quiet_NaN(), 1.0));
  EXPECT_TRUE(g.step(std::numeric_limits<double>::infinity(), 1.0));
  EXPECT_FALSE(g.step(1.0, 1.0));
}

TEST(SpikeGuard, AFlatWindowJudgesNothing) {
  Guard g(6, 6, 3);
  for (int i = 0; i < 3; ++i) g.step(2.0, 1.0);
  EXPECT_FALSE(g.step(2.5, 1.5)) << "deviation 0: no z-score";
}

TEST(SpikeGuard, StateHoldsTheLastStepAndItsWindow) {
  Guard g(6, 6, 2);
  g.step(1.0, 3.0);
  g.step(3.0, 5.0);
  g.step(10.0, 4.0);
  at::Tensor out = at::zeros({train::SpikeGuard::kStateSlots}, at::kDouble);
  g.guard.write_state(out);
  const std::vector<double> want = {10.0, 2.0, 1.0, 4.0, 4.0, 1.0};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_DOUBLE_EQ(out[static_cast<int64_t>(i)].item<double>(), want[i]) << "slot " << i;
  }
  // The names readers use (StepMetrics) point at the same slots.
  using G = train::SpikeGuard;
  const double by_name[2][3] = {{10.0, 2.0, 1.0}, {4.0, 4.0, 1.0}};
  for (const G::Judged v : {G::kLoss, G::kGradNorm}) {
    for (const G::Stat s : {G::kStepValue, G::kWindowMean, G::kWindowStd}) {
      EXPECT_DOUBLE_EQ(out[G::state_slot(v, s)].item<double>(), by_name[v][s]) << v << " " << s;
    }
  }
}

TEST(SpikeGuard, InjectionSpecs) {
  EXPECT_EQ(train::parse_spike_injections("5; 7 ;9"), (std::vector<int64_t>{5, 7, 9}));
  EXPECT_TRUE(train::parse_spike_injections("").empty());
  for (const char* bad : {"0", "x", "3:4", "-2"}) {
    EXPECT_THROW(train::parse_spike_injections(bad), std::invalid_argument) << bad;
  }
}

}  // namespace TRAINER_UNITY_ID
