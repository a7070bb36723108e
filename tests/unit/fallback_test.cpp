// The fallback ladder's state machine (memory/fallback.h): which rung comes next, and when the
// ladder is spent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "memory/fallback.h"

namespace {

using memory::FallbackLadder;
using memory::Rung;

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

TEST(FallbackLadder, CheckpointingFirstKeepsTheMicroBatchThenHalves) {
  FallbackLadder ladder({Rung::kCheckpointActivations, Rung::kHalveMicroBatch}, 8, 2,
                        /*has_cache=*/false, /*can_checkpoint=*/true);
  const auto first = ladder.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rung, Rung::kCheckpointActivations);
  EXPECT_EQ(first->new_micro_batch, 8);
  EXPECT_EQ(ladder.micro_batch(), 8);
  EXPECT_EQ(ladder.next()->new_micro_batch, 4);
  EXPECT_EQ(ladder.next()->new_micro_batch, 2);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, ModelWithoutCheckpointingSkipsThatRung) {
  FallbackLadder ladder({Rung::kCheckpointActivations, Rung::kHalveMicroBatch}, 4, 1,
                        /*has_cache=*/false, /*can_checkpoint=*/false);
  EXPECT_EQ(ladder.next()->rung, Rung::kHalveMicroBatch);
}

TEST(FallbackLadder, CheckpointingAfterHalvingIsTakenAtTheFloor) {
  FallbackLadder ladder({Rung::kHalveMicroBatch, Rung::kCheckpointActivations}, 4, 2,
                        /*has_cache=*/false, /*can_checkpoint=*/true);
  EXPECT_EQ(ladder.next()->new_micro_batch, 2);
  EXPECT_EQ(ladder.next()->rung, Rung::kCheckpointActivations);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, ShardingFirstKeepsTheMicroBatchThenHalves) {
  FallbackLadder ladder({Rung::kShardOptimizer, Rung::kHalveMicroBatch}, 4, 2,
                        /*has_cache=*/false, /*can_checkpoint=*/false, /*can_shard=*/true);
  const auto first = ladder.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rung, Rung::kShardOptimizer);
  EXPECT_EQ(first->new_micro_batch, 4);
  EXPECT_EQ(ladder.next()->new_micro_batch, 2);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, AlreadyShardedOrOneRankSkipsShardOptimizer) {
  FallbackLadder ladder({Rung::kShardOptimizer, Rung::kHalveMicroBatch}, 4, 1,
                        /*has_cache=*/false, /*can_checkpoint=*/false, /*can_shard=*/false);
  EXPECT_EQ(ladder.next()->rung, Rung::kHalveMicroBatch);
}

TEST(FallbackLadder, EmptyLadderIsSpent) {
  FallbackLadder ladder({}, 8, 1, true);
  EXPECT_FALSE(ladder.next());
}

TEST(FallbackLadder, RungNames) {
  EXPECT_EQ(memory::parse_rung("halve_micro_batch"), Rung::kHalveMicroBatch);
  EXPECT_EQ(memory::to_string(Rung::kUncacheEmbeddings), "uncache_embeddings");
  EXPECT_EQ(memory::parse_rung("checkpoint_activations"), Rung::kCheckpointActivations);
  EXPECT_EQ(memory::to_string(Rung::kCheckpointActivations), "checkpoint_activations");
  EXPECT_EQ(memory::parse_rung("shard_optimizer"), Rung::kShardOptimizer);
  EXPECT_EQ(memory::to_string(Rung::kShardOptimizer), "shard_optimizer");
  EXPECT_THROW(memory::parse_rung("shrink"), std::invalid_argument);
}

}  // namespace
