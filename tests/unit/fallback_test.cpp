// The fallback ladder's state machine (memory/fallback.h): which rung comes next, and when the
// ladder is spent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "memory/fallback.h"

#include <optional>
#include <string>

namespace TRAINER_UNITY_ID {

using memory::Rung;

const std::vector<Rung> kDefault = {Rung::kHalveMicroBatch, Rung::kUncacheEmbeddings};

// What a taken rung did (the test's own record of the effects the ladder ran).
struct Taken {
  Rung rung;
  int64_t old_micro_batch = 0;
  int64_t new_micro_batch = 0;
};

// A memory::FallbackLadder whose rungs' effects record what they were asked to do; next() takes
// the next rung as the Trainer does, and returns its record.
class FallbackLadder {
 public:
  FallbackLadder(const std::vector<Rung>& order, int64_t micro_batch, int64_t min_micro_batch,
                 bool has_cache, bool can_checkpoint = false, bool can_shard = false)
      : micro_batch_(micro_batch) {
    memory::RungEffects effects;
    effects.halve_micro_batch = [this](int64_t old_micro, int64_t new_micro) {
      micro_batch_ = new_micro;
      return "halved " + std::to_string(old_micro) + " -> " + std::to_string(new_micro);
    };
    const auto once = [](const char* change) { return [change] { return std::string(change); }; };
    if (has_cache) effects.uncache_embeddings = once("uncached");
    if (can_checkpoint) effects.checkpoint_activations = once("checkpointing");
    if (can_shard) effects.shard_optimizer = once("sharded");
    ladder_ = memory::FallbackLadder(order, micro_batch, min_micro_batch, std::move(effects));
  }
  std::optional<Taken> next() {
    memory::FallbackRung* rung = ladder_.next();
    if (rung == nullptr) return std::nullopt;
    const int64_t old = micro_batch_;
    last_change_ = rung->take();
    return Taken{rung->kind(), old, micro_batch_};
  }
  int64_t micro_batch() const { return micro_batch_; }
  const std::string& last_change() const { return last_change_; }

 private:
  int64_t micro_batch_;
  std::string last_change_;
  memory::FallbackLadder ladder_;
};

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

TEST(FallbackLadder, EachRungKindIsOneObjectEvenListedTwice) {
  FallbackLadder ladder({Rung::kUncacheEmbeddings, Rung::kHalveMicroBatch, Rung::kUncacheEmbeddings,
                         Rung::kHalveMicroBatch},
                        4, 2, /*has_cache=*/true);
  EXPECT_EQ(ladder.next()->rung, Rung::kUncacheEmbeddings);
  EXPECT_EQ(ladder.next()->new_micro_batch, 2);
  EXPECT_FALSE(ladder.next()) << "the caches are gone and the micro-batch is at the floor";
}

TEST(FallbackLadder, EveryTakenRungIsAnnouncedInOneFormat) {
  FallbackLadder ladder({Rung::kHalveMicroBatch}, 8, 1, /*has_cache=*/false);
  ASSERT_TRUE(ladder.next());
  EXPECT_EQ(ladder.last_change(), "halved 8 -> 4") << "the rung's effect says what changed";
  memory::HalveMicroBatch rung(8, 1, nullptr);
  EXPECT_EQ(memory::taken_message(5, {"rank 1 in backward (micro-batch 8): no memory"}, rung,
                                  "micro-batch 8 -> 4"),
            "step 5: out of memory on 1 rank(s): rank 1 in backward (micro-batch 8): no memory. "
            "Fallback halve_micro_batch: micro-batch 8 -> 4; retrying the step.");
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

}  // namespace TRAINER_UNITY_ID
