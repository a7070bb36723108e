// The learning-rate schedules (train/schedule.h) in closed form: linear warmup, then cosine,
// linear, constant or warmup-stable-decay, and the plan a resume keeps or re-anchors. The values
// at every step, against a formula written from the definition in Python, including resumes that
// change train.steps: tests/e2e/schedule_test.py.

#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

namespace TRAINER_UNITY_ID {

using train::DecayShape;
using train::Schedule;
using train::ScheduleKind;

train::TrainOptions options(int64_t steps, int64_t warmup, double min_ratio,
                            ScheduleKind kind = ScheduleKind::kCosine, double decay_fraction = 0.2,
                            DecayShape shape = DecayShape::kLinear) {
  train::TrainOptions o;
  o.steps = steps;
  o.warmup_steps = warmup;
  o.min_lr_ratio = min_ratio;
  o.schedule = kind;
  o.decay_fraction = decay_fraction;
  o.decay_shape = shape;
  return o;
}

double lr(int64_t step, int64_t total, int64_t warmup, double peak, double min_ratio) {
  return peak * Schedule(options(total, warmup, min_ratio)).factor(step);
}

TEST(LearningRate, WarmupIsLinear) {
  EXPECT_DOUBLE_EQ(lr(0, 100, 4, 1.0, 0.1), 0.25);
  EXPECT_DOUBLE_EQ(lr(1, 100, 4, 1.0, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(lr(2, 100, 4, 1.0, 0.1), 0.75);
  EXPECT_DOUBLE_EQ(lr(0, 100, 10, 0.003, 0.1), 0.0003);
}

TEST(LearningRate, PeakAtTheEndOfWarmup) {
  EXPECT_DOUBLE_EQ(lr(3, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(lr(4, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(lr(0, 100, 0, 2.0, 0.1), 2.0);  // no warmup: peak at once
}

TEST(LearningRate, MinimumAtTheLastStep) {
  EXPECT_DOUBLE_EQ(lr(99, 100, 10, 2.0, 0.1), 0.2);
  EXPECT_DOUBLE_EQ(lr(49, 50, 0, 1.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(lr(150, 100, 10, 2.0, 0.1), 0.2);  // past the end stays there
}

TEST(LearningRate, CosineHalfwayIsTheMean) {
  // 12 steps, warmup 1: decay over steps 1..11 (10 intervals), halfway at step 6.
  EXPECT_DOUBLE_EQ(lr(6, 12, 1, 1.0, 0.1), 0.55);
}

TEST(LearningRate, DecayIsMonotoneAfterWarmup) {
  const int64_t total = 200, warmup = 20;
  double previous = lr(warmup, total, warmup, 1.0, 0.1);
  for (int64_t step = warmup + 1; step < total; ++step) {
    const double value = lr(step, total, warmup, 1.0, 0.1);
    EXPECT_LT(value, previous) << "step " << step;
    EXPECT_GE(value, 0.1 - 1e-12);
    previous = value;
  }
  for (int64_t step = 0; step + 1 < warmup; ++step) {
    EXPECT_LT(lr(step, total, warmup, 1.0, 0.1), lr(step + 1, total, warmup, 1.0, 0.1));
  }
}

TEST(LearningRate, LinearAndConstant) {
  const Schedule linear(options(12, 1, 0.1, ScheduleKind::kLinear));
  EXPECT_DOUBLE_EQ(linear.factor(6), 0.55);  // halfway down a straight line
  EXPECT_DOUBLE_EQ(linear.factor(11), 0.1);
  const Schedule constant(options(12, 2, 0.1, ScheduleKind::kConstant));
  EXPECT_DOUBLE_EQ(constant.factor(0), 0.5);
  EXPECT_DOUBLE_EQ(constant.factor(11), 1.0);
}

TEST(LearningRate, WsdIsStableThenDecaysOverItsFraction) {
  // 100 steps, decay 0.2: the last 20 steps decay; step 79 is the last at the peak.
  for (const DecayShape shape :
       {DecayShape::kLinear, DecayShape::kCosine, DecayShape::kOneMinusSqrt}) {
    const Schedule wsd(options(100, 10, 0.0, ScheduleKind::kWsd, 0.2, shape));
    EXPECT_DOUBLE_EQ(wsd.factor(10), 1.0);
    EXPECT_DOUBLE_EQ(wsd.factor(79), 1.0);
    EXPECT_LT(wsd.factor(80), 1.0);
    EXPECT_DOUBLE_EQ(wsd.factor(99), 0.0);
    EXPECT_EQ(wsd.plan().anchor, 79);
  }
  const Schedule sqrt(options(100, 10, 0.0, ScheduleKind::kWsd, 0.2, DecayShape::kOneMinusSqrt));
  EXPECT_DOUBLE_EQ(sqrt.factor(84), 1.0 - std::sqrt(5.0 / 20.0));
}

TEST(LearningRate, ResumeWithTheSameStepsKeepsThePlan) {
  Schedule fresh(options(100, 10, 0.1));
  Schedule resumed(options(100, 10, 0.1));
  resumed.resume(40, fresh.plan());
  for (int64_t i = 40; i < 100; ++i) EXPECT_EQ(resumed.factor(i), fresh.factor(i));
}

TEST(LearningRate, ResumeWithMoreStepsContinuesFromTheSameValue) {
  for (const ScheduleKind kind :
       {ScheduleKind::kCosine, ScheduleKind::kLinear, ScheduleKind::kWsd}) {
    const Schedule before(options(100, 10, 0.1, kind, 0.3));
    Schedule after(options(250, 10, 0.1, kind, 0.3));
    after.resume(90, before.plan());  // decaying at step 90 in every kind
    EXPECT_DOUBLE_EQ(after.factor(90), before.factor(90));
    EXPECT_DOUBLE_EQ(after.factor(249), 0.1);
    EXPECT_GT(after.factor(91), after.factor(200));
  }
}

TEST(LearningRate, WsdExtendedFromItsStableStageDecaysAtTheNewEnd) {
  const Schedule before(options(100, 10, 0.0, ScheduleKind::kWsd, 0.2));
  Schedule extended(options(300, 10, 0.0, ScheduleKind::kWsd, 0.2));
  extended.resume(50, before.plan());  // stable at step 50
  const Schedule fresh(options(300, 10, 0.0, ScheduleKind::kWsd, 0.2));
  for (int64_t i = 50; i < 300; ++i) EXPECT_EQ(extended.factor(i), fresh.factor(i)) << i;
  // Annealed at once: a new end whose decay would have started before the resume step.
  Schedule annealed(options(71, 10, 0.0, ScheduleKind::kWsd, 1.0));
  annealed.resume(50, before.plan());
  EXPECT_DOUBLE_EQ(annealed.factor(50), 1.0);
  EXPECT_DOUBLE_EQ(annealed.factor(60), 0.5);
  EXPECT_DOUBLE_EQ(annealed.factor(70), 0.0);
}

TEST(LearningRate, PlanTextReadsBackExactly) {
  const train::SchedulePlan plan{1234, 0.1, 77, 1.0 / 3.0};
  EXPECT_EQ(Schedule::from_text(Schedule::to_text(plan)), plan);
  EXPECT_THROW(Schedule::from_text("steps=1"), std::invalid_argument);
}

}  // namespace TRAINER_UNITY_ID
