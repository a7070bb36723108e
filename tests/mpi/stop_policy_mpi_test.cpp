// The signal a stopped run ends for, agreed over the ranks (launcher/stop_policy.h): srun passes a
// signal on to the tasks one by one, so the ranks stop together for a signal that some of them
// have not received yet, and must still end with the same exit code.
#include <gtest/gtest.h>

#include <csignal>

#include "common/mpi_test_env.h"
#include "launcher/stop_policy.h"

namespace TRAINER_UNITY_ID {

TEST(StopPolicyMpi, EveryRankEndsForTheSignalThatReachedAnyRank) {
  auto control = trainer_test::runtime().world(std::chrono::seconds(30));
  const int rank = control->rank();
  const int last = control->size() - 1;
  using launcher::agree_on_stop_signal;
  // The warning reached only the last rank.
  EXPECT_EQ(agree_on_stop_signal(*control, rank == last ? SIGUSR1 : 0), SIGUSR1);
  // A terminating signal outranks the warning, wherever each landed.
  EXPECT_EQ(agree_on_stop_signal(*control, rank == last ? SIGTERM : SIGUSR1), SIGTERM);
  EXPECT_EQ(agree_on_stop_signal(*control, rank == 0 ? SIGINT : SIGUSR1), SIGINT);
  // Two terminating signals: the larger number (SIGTERM, 15, over SIGINT, 2).
  EXPECT_EQ(agree_on_stop_signal(*control, rank == 0 ? SIGINT : SIGTERM),
            control->size() > 1 ? SIGTERM : SIGINT);
  EXPECT_EQ(agree_on_stop_signal(*control, 0), 0);
}

}  // namespace TRAINER_UNITY_ID
