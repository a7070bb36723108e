// The exit code after a run (launcher/stop_policy.h): after a signal, 128 + its number, except a
// SIGUSR1 that came with the last step (nothing left to requeue).
#include <gtest/gtest.h>

#include <csignal>

#include "launcher/exit_codes.h"
#include "launcher/stop_policy.h"

namespace TRAINER_UNITY_ID {

TEST(StopPolicy, ExitCodeAfterARun) {
  using launcher::exit_code_after_run;
  EXPECT_EQ(exit_code_after_run(false, 0, 100, 100), launcher::kExitOk);
  EXPECT_EQ(exit_code_after_run(true, SIGTERM, 40, 100), 128 + SIGTERM);
  EXPECT_EQ(exit_code_after_run(true, SIGINT, 100, 100), 128 + SIGINT);
  EXPECT_EQ(exit_code_after_run(true, SIGUSR1, 40, 100), 128 + SIGUSR1);  // requeued
  // The warning came with the last step: complete, nothing to requeue.
  EXPECT_EQ(exit_code_after_run(true, SIGUSR1, 100, 100), launcher::kExitOk);
}

}  // namespace TRAINER_UNITY_ID
