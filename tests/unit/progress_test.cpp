// log.progress: which ranks draw, the ETA's wording, and when the step line gets an ETA. (The
// bar itself is checked end to end, under a pseudo-terminal: tests/e2e/e2e.sh progress_bar.)

#include <gtest/gtest.h>

#include "train/report/progress.h"

namespace TRAINER_UNITY_ID {

using train::ProgressMode;
using train::ProgressSetting;

TEST(Progress, AutoDrawsOnlyOnRankZeroAtATerminal) {
  EXPECT_EQ(train::progress_mode(ProgressSetting::kAuto, 0, true), ProgressMode::kBar);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kAuto, 0, false), ProgressMode::kLines);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kAuto, 1, true), ProgressMode::kOff);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kBar, 0, false), ProgressMode::kBar);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kBar, 3, true), ProgressMode::kOff);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kLines, 0, true), ProgressMode::kLines);
  EXPECT_EQ(train::progress_mode(ProgressSetting::kOff, 0, true), ProgressMode::kOff);
}

TEST(Progress, DurationsRoundUpToWholeSeconds) {
  EXPECT_EQ(train::format_duration(0), "0s");
  EXPECT_EQ(train::format_duration(0.2), "1s");
  EXPECT_EQ(train::format_duration(59), "59s");
  EXPECT_EQ(train::format_duration(60), "1m00s");
  EXPECT_EQ(train::format_duration(192), "3m12s");
  EXPECT_EQ(train::format_duration(3600), "1h00m");
  EXPECT_EQ(train::format_duration(3 * 3600 + 125), "3h02m");
  EXPECT_EQ(train::format_duration(-5), "0s");
}

TEST(Progress, TheStepLineHasAnEtaOnceAStepPastTheFirstIsDone) {
  train::Progress lines(ProgressMode::kLines, /*start_step=*/20, /*total_steps=*/50, 8);
  lines.tick(21);
  EXPECT_EQ(lines.eta_suffix(), "");  // the first step carries warm-up: no pace yet
  lines.tick(22);
  EXPECT_NE(lines.eta_suffix().find(" eta "), std::string::npos);
  lines.tick(50);
  EXPECT_EQ(lines.eta_suffix(), " eta 0s");

  train::Progress off(ProgressMode::kOff, 0, 50, 8);
  off.tick(1);
  off.tick(2);
  EXPECT_EQ(off.eta_suffix(), "");
}

}  // namespace TRAINER_UNITY_ID
