// The fallback ladder's state machine and the OOM injection spec (memory/).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "memory/allocator_guard.h"
#include "memory/fallback.h"

namespace {

using memory::FallbackLadder;
using memory::Rung;
using ::testing::HasSubstr;

const std::vector<Rung> kDefault = {Rung::kHalveMicroBatch, Rung::kUncacheEmbeddings};

TEST(FallbackLadder, HalvesDownToTheFloorThenUncachesThenIsSpent) {
  FallbackLadder ladder(kDefault, 100, 20, /*has_cache=*/true);
  std::vector<std::pair<int64_t, int64_t>> halvings;
  for (int i = 0; i < 2; ++i) {
    const auto a = ladder.next();
    ASSERT_TRUE(a);
    EXPECT_EQ(a->rung, Rung::kHalveMicroBatch);
    halvings.emplace_back(a->old_micro_batch, a->new_micro_batch);
  }
  EXPECT_EQ(halvings, (std::vector<std::pair<int64_t, int64_t>>{{100, 50}, {50, 25}}));
  const auto third = ladder.next();  // 25 / 2 = 12 is below the floor: 20
  ASSERT_TRUE(third);
  EXPECT_EQ(third->rung, Rung::kHalveMicroBatch);
  EXPECT_EQ(third->new_micro_batch, 20);
  const auto fourth = ladder.next();
  ASSERT_TRUE(fourth);
  EXPECT_EQ(fourth->rung, Rung::kUncacheEmbeddings);
  EXPECT_EQ(fourth->new_micro_batch, 20);
  EXPECT_FALSE(ladder.next());
  EXPECT_FALSE(ladder.next()) << "a spent ladder stays spent";
}

TEST(FallbackLadder, ModelWithoutCacheSkipsTheUncacheRung) {
  FallbackLadder ladder(kDefault, 4, 1, /*has_cache=*/false);
  EXPECT_EQ(ladder.next()->new_micro_batch, 2);
  EXPECT_EQ(ladder.next()->new_micro_batch, 1);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, AtTheFloorFromTheStart) {
  FallbackLadder ladder(kDefault, 8, 8, /*has_cache=*/true);
  const auto a = ladder.next();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->rung, Rung::kUncacheEmbeddings);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, OrderFollowsTheConfiguration) {
  FallbackLadder ladder({Rung::kUncacheEmbeddings, Rung::kHalveMicroBatch}, 8, 1, true);
  EXPECT_EQ(ladder.next()->rung, Rung::kUncacheEmbeddings);
  EXPECT_EQ(ladder.next()->new_micro_batch, 4);
}

TEST(FallbackLadder, EmptyLadderIsSpent) {
  FallbackLadder ladder({}, 8, 1, true);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, RungNames) {
  EXPECT_EQ(memory::parse_rung("halve_micro_batch"), Rung::kHalveMicroBatch);
  EXPECT_EQ(memory::to_string(Rung::kUncacheEmbeddings), "uncache_embeddings");
  EXPECT_THROW(memory::parse_rung("shrink"), std::invalid_argument);
}

TEST(InjectionSpec, ParsesEntries) {
  const auto v = memory::parse_injections(" 1:5:backward ; 0:2:forward:always;2:3:forward:2 ");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].rank, 1);
  EXPECT_EQ(v[0].step, 5);
  EXPECT_EQ(v[0].phase, memory::Phase::kBackward);
  EXPECT_EQ(v[0].times, 1);
  EXPECT_EQ(v[1].times, -1);
  EXPECT_EQ(v[2].times, 2);
  EXPECT_TRUE(memory::parse_injections("").empty());
}

TEST(InjectionSpec, BadEntriesNameTheKeyAndTheEntry) {
  for (const std::string bad : {"1:5", "x:5:forward", "1:5:sideways", "1:-2:forward", "1:5:forward:often"}) {
    try {
      memory::parse_injections(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("memory.inject_oom: '" + bad + "'"));
    }
  }
}

}  // namespace
