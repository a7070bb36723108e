// memory.inject_oom's entries (memory/allocator_guard.h): parsed, or refused naming the key and
// the entry.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "memory/allocator_guard.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

TEST(InjectionSpec, ParsesEntries) {
  const auto v = memory::parse_injections(" 1:5:backward ; 0:2:forward:always;2:3:forward:2 ");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].rank, 1);
  EXPECT_EQ(v[0].step, 5);
  EXPECT_EQ(v[0].phase, memory::Phase::kBackward);
  EXPECT_EQ(v[0].times, 1);
  EXPECT_EQ(v[1].times, -1);
  EXPECT_EQ(v[2].times, 2);
  EXPECT_EQ(memory::parse_injections("0:1:optimizer")[0].phase, memory::Phase::kOptimizer);
  EXPECT_TRUE(memory::parse_injections("").empty());
}

TEST(InjectionSpec, BadEntriesNameTheKeyAndTheEntry) {
  for (const std::string bad :
       {"1:5", "x:5:forward", "1:5:sideways", "1:-2:forward", "1:5:forward:often"}) {
    try {
      memory::parse_injections(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("memory.inject_oom: '" + bad + "'"));
    }
  }
}

}  // namespace TRAINER_UNITY_ID
