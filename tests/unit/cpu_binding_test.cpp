#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/cpu_binding.h"

// CPU binding (launcher/cpu_binding.h): a rank that mpirun bound to one core of its share is
// rebound to its share; a binding as wide as the share, or train.threads set, stands.
TEST(CpuBinding, RankBoundToFewerCoresThanItsShareIsRebound) {
  const std::vector<int> node = {0, 1, 2, 3, 4, 5, 6, 7};
  // mpirun -np 1: bound to core 0 of 8.
  const auto alone = launcher::plan_cpu_binding(node, {0}, 0, 1, 0);
  EXPECT_TRUE(alone.rebound);
  EXPECT_EQ(alone.cpus, node);
  EXPECT_EQ(alone.threads, 8);
  EXPECT_EQ(alone.describe(),
            "cpus 0-7 (the launcher bound it to 0: fewer than its share of the node)");
  // mpirun -np 2: rank 1 bound to core 1; its share is the second half.
  const auto second = launcher::plan_cpu_binding(node, {1}, 1, 2, 0);
  EXPECT_TRUE(second.rebound);
  EXPECT_EQ(second.cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(second.threads, 4);
  // Three ranks on eight cores: blocks of 3, 3 and 2.
  EXPECT_EQ(launcher::plan_cpu_binding(node, {0}, 2, 3, 0).cpus, (std::vector<int>{6, 7}));
  EXPECT_EQ(launcher::plan_cpu_binding(node, {0}, 0, 3, 0).cpus, (std::vector<int>{0, 1, 2}));
}

TEST(CpuBinding, WideEnoughBindingOrExplicitThreadsStand) {
  const std::vector<int> node = {0, 1, 2, 3};
  // --bind-to none: every core stays allowed; threads = its share (2 ranks on 4 cores: 2).
  const auto unbound = launcher::plan_cpu_binding(node, node, 0, 2, 0);
  EXPECT_FALSE(unbound.rebound);
  EXPECT_EQ(unbound.cpus, node);
  EXPECT_EQ(unbound.threads, 2);
  EXPECT_EQ(unbound.describe(), "cpus 0-3");
  // srun --cpus-per-task=2: exactly the share.
  EXPECT_FALSE(launcher::plan_cpu_binding(node, {2, 3}, 1, 2, 0).rebound);
  // train.threads set: the user's binding and thread count, whatever they are.
  const auto manual = launcher::plan_cpu_binding(node, {0}, 0, 1, 3);
  EXPECT_FALSE(manual.rebound);
  EXPECT_EQ(manual.cpus, (std::vector<int>{0}));
  EXPECT_EQ(manual.threads, 3);
  // More ranks than cores, bound to both (oversubscribed): one thread each, not one per core.
  const auto crowded = launcher::plan_cpu_binding({0, 1}, {0, 1}, 2, 3, 0);
  EXPECT_FALSE(crowded.rebound);
  EXPECT_EQ(crowded.threads, 1);
  // ... and bound to one core each: stays, one thread.
  EXPECT_EQ(launcher::plan_cpu_binding({0, 1}, {1}, 2, 3, 0).threads, 1);
}

TEST(CpuBinding, CpuListsRoundTrip) {
  EXPECT_EQ(launcher::parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(launcher::format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_TRUE(launcher::parse_cpu_list("").empty());
}
