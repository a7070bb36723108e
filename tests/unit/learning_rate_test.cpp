// The learning-rate schedule (train/schedule.h) in closed form: linear warmup, then cosine decay.

#include <gtest/gtest.h>

#include "train/schedule.h"

namespace {

using train::learning_rate;

TEST(LearningRate, WarmupIsLinear) {
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 4, 1.0, 0.1), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(1, 100, 4, 1.0, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(2, 100, 4, 1.0, 0.1), 0.75);
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 10, 0.003, 0.1), 0.0003);
}

TEST(LearningRate, PeakAtTheEndOfWarmup) {
  EXPECT_DOUBLE_EQ(learning_rate(3, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(4, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 0, 2.0, 0.1), 2.0);  // no warmup: peak at once
}

TEST(LearningRate, MinimumAtTheLastStep) {
  EXPECT_DOUBLE_EQ(learning_rate(99, 100, 10, 2.0, 0.1), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(49, 50, 0, 1.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(150, 100, 10, 2.0, 0.1), 0.2);  // past the end stays there
}

TEST(LearningRate, CosineHalfwayIsTheMean) {
  // 12 steps, warmup 1: decay over steps 1..11 (10 intervals), halfway at step 6.
  EXPECT_DOUBLE_EQ(learning_rate(6, 12, 1, 1.0, 0.1), 0.55);
}

TEST(LearningRate, DecayIsMonotoneAfterWarmup) {
  const int64_t total = 200, warmup = 20;
  double previous = learning_rate(warmup, total, warmup, 1.0, 0.1);
  for (int64_t step = warmup + 1; step < total; ++step) {
    const double lr = learning_rate(step, total, warmup, 1.0, 0.1);
    EXPECT_LT(lr, previous) << "step " << step;
    EXPECT_GE(lr, 0.1 - 1e-12);
    previous = lr;
  }
  for (int64_t step = 0; step + 1 < warmup; ++step) {
    EXPECT_LT(learning_rate(step, total, warmup, 1.0, 0.1),
              learning_rate(step + 1, total, warmup, 1.0, 0.1));
  }
}

}  // namespace
