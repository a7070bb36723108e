// Periodic actions (train/periodic.h): when each is due, the order they run in, and the buckets
// their time goes to (the `done:` line's, train::done_line).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "train/periodic.h"
#include "train/report/run_report.h"

namespace TRAINER_UNITY_ID {

using train::Cadence;

TEST(Cadence, EveryNthStepTheLastAndOneStep) {
  const Cadence every3{.every = 3};
  EXPECT_FALSE(every3.due(1, false));
  EXPECT_TRUE(every3.due(3, false));
  EXPECT_TRUE(every3.due(6, true));
  EXPECT_FALSE(every3.due(7, true)) << "not after_last";
  const Cadence last{.after_last = true};
  EXPECT_FALSE(last.due(3, false));
  EXPECT_TRUE(last.due(7, true));
  const Cadence once{.once_at = 4};
  EXPECT_TRUE(once.due(4, false));
  EXPECT_FALSE(once.due(8, false));
  EXPECT_FALSE(Cadence{}.due(1, true)) << "an empty cadence is never due";
}

TEST(PeriodicActions, RunDueOnesInRegistrationOrderEachTimedInItsBucket) {
  train::PeriodicActions actions;
  std::vector<std::string> ran;
  const auto record = [&ran](std::string what, int sleep_ms = 0) {
    return [&ran, what, sleep_ms](int64_t step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      ran.push_back(what + "@" + std::to_string(step));
    };
  };
  actions.add({"table", "memory tables", {.every = 2, .after_last = true}, record("table")});
  actions.add({"eval", "evaluation", {.every = 3}, record("eval", 30)});
  actions.add({"final", "checkpoints", {.after_last = true}, record("final")});
  actions.add({"estimate", "memory tables", {.once_at = 1}, record("estimate")});

  double aside = actions.run_due(1, false);
  EXPECT_EQ(aside, actions.buckets()[0].second) << "step 1: the estimate alone";
  for (int64_t step = 2; step <= 5; ++step) aside += actions.run_due(step, step == 5);
  EXPECT_EQ(ran, (std::vector<std::string>{"estimate@1", "table@2", "eval@3", "table@4", "table@5",
                                           "final@5"}));
  ASSERT_EQ(actions.buckets().size(), 3u) << "two actions share the memory tables' bucket";
  EXPECT_EQ(actions.buckets()[0].first, "memory tables");
  EXPECT_EQ(actions.buckets()[1].first, "evaluation");
  EXPECT_EQ(actions.buckets()[2].first, "checkpoints");
  EXPECT_GE(actions.buckets()[1].second, 0.03) << "the evaluation's time goes to its bucket";
  EXPECT_LT(actions.buckets()[0].second, 0.03) << "and to no other";
  double total = 0;
  for (const auto& [bucket, seconds] : actions.buckets()) total += seconds;
  EXPECT_NEAR(aside, total, 1e-9) << "run_due returns the seconds its buckets got";
}

TEST(DoneLine, ReportsEveryBucketApart) {
  train::RunSummary s;
  s.steps_done = 150;
  s.first_loss = 2.5;
  s.last_loss = 1.25;
  s.samples_per_s = 1000;
  s.aside = {{"memory tables", 0.1}, {"evaluation", 1.24}, {"samples", 0.4}, {"checkpoints", 2}};
  s.fallbacks = 1;
  EXPECT_EQ(train::done_line(s, 75),
            "done: 150 steps (75 in this run), loss 2.5000 -> 1.2500, 1000.0 samples/s in training "
            "(memory tables 0.1 s, evaluation 1.2 s, samples 0.4 s, checkpoints 2.0 s apart), 1 "
            "memory fallback(s)");
  s.aside.clear();
  EXPECT_EQ(train::done_line(s, 0),
            "done: 150 steps, loss 2.5000 -> 1.2500, 1000.0 samples/s in training, 1 memory "
            "fallback(s)");
}

}  // namespace TRAINER_UNITY_ID
