// The fallback ladder's state machine and the OOM injection spec (memory/).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "memory/allocator_guard.h"
#include "memory/fallback.h"
#include "memory/estimator.h"
#include "memory/memory_stats.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace {

using memory::Rung;
using ::testing::HasSubstr;

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
                         Rung::kHalveMicroBatch}, 4, 2, /*has_cache=*/true);
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

namespace {

memory::MemorySample cpu_sample(int64_t peak_mib, int64_t budget_mib) {
  memory::MemorySample s;
  s.tensor_bytes = peak_mib << 20;
  s.tensor_peak_bytes = peak_mib << 20;
  s.resident_bytes = 400LL << 20;
  s.peak_resident_bytes = 410LL << 20;
  s.total_bytes = budget_mib << 20;
  s.free_bytes = (budget_mib - peak_mib) << 20;
  return s;
}

TEST(MemoryTable, OneRowPerRankAndWarnings) {
  std::vector<memory::MemorySample> ranks = {cpu_sample(100, 1000), cpu_sample(950, 1000),
                                             cpu_sample(110, 1000)};
  std::vector<std::string> warnings;
  const std::string table = memory::format_memory_table(ranks, "memory at step 5", 0.92, &warnings);
  EXPECT_THAT(table, HasSubstr("memory at step 5 (MiB)"));
  EXPECT_THAT(table, HasSubstr("     1      950    950       n/a    400       410        50      1000   n/a   95%"));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0], HasSubstr("rank 1 uses 95% of its memory, above memory.high_watermark = 92%"));
  EXPECT_THAT(warnings[1], HasSubstr("rank 1 peaks at 950 MiB of tensors, far above the median rank's 110 MiB"));
}

TEST(MemoryTable, RoundTripsThroughTheGatherVector) {
  const auto s = cpu_sample(12, 64);
  const auto v = s.to_vector();
  ASSERT_EQ(v.size(), size_t(memory::MemorySample::kFields));
  const auto back = memory::MemorySample::from_vector(v.data());
  EXPECT_EQ(back.tensor_peak_bytes, s.tensor_peak_bytes);
  EXPECT_EQ(back.total_bytes, s.total_bytes);
  EXPECT_EQ(back.utilization, -1);
}

TEST(MemoryTable, CpuSampleCountsTensorsThroughTheGuard) {
  const auto before = memory::sample_memory(c10::Device(c10::kCPU));
  at::Tensor big = at::empty({1 << 20}, at::kFloat);  // 4 MiB
  const auto after = memory::sample_memory(c10::Device(c10::kCPU));
  EXPECT_EQ(after.tensor_bytes - before.tensor_bytes, 4 << 20);
  EXPECT_GT(after.resident_bytes, 0);
  EXPECT_GT(after.total_bytes, 0);
}

}  // namespace

namespace {

TEST(MemoryEstimate, PeakAddsEveryKindAndFitsTheProbe) {
  memory::MemoryEstimate e;
  e.parameters = 1000;
  e.gradients = 1000;
  e.optimizer_state = 2000;
  e.caches = 500;
  e.loader = 100;
  // Probe: 8 samples peak at 3000, 16 samples at 5000 -> 250/sample + 1000 fixed.
  memory::fit_activations(8, 3000, 16, 5000, &e);
  EXPECT_EQ(e.activation_per_sample, 250);
  EXPECT_EQ(e.activation_fixed, 1000);
  EXPECT_EQ(e.persistent(), 4500);
  EXPECT_EQ(e.peak(10), 4500 + 100 + 1000 + 2500);
  EXPECT_THAT(e.describe(10), HasSubstr("at micro-batch 10"));
}

TEST(MemoryEstimate, LargestMicroBatchThatFits) {
  memory::MemoryEstimate e;
  e.parameters = 4000;
  e.activation_fixed = 1000;
  e.activation_per_sample = 100;
  EXPECT_EQ(memory::largest_micro_batch(e, 5000 + 100 * 37 + 99, 64), 37);
  EXPECT_EQ(memory::largest_micro_batch(e, 1 << 30, 64), 64) << "capped at the per-rank batch";
  EXPECT_EQ(memory::largest_micro_batch(e, 100, 64), 1) << "nothing fits: the fallback decides";
  e.activation_per_sample = 0;
  EXPECT_EQ(memory::largest_micro_batch(e, 100, 64), 64);
}

// A chunked loss: fixed 1000, 100 per sample, 10 per row of the loss's chunk, 16 rows per sample
// and chunks of at most 64 rows. Probes at 2 and 4 samples (32 and 64 rows), and 2 samples again
// with chunks of 16 rows. The straight line through the first two would say 260 per sample.
TEST(MemoryEstimate, ChunkedLossStopsGrowingOnceAChunkIsFull) {
  memory::MemoryEstimate e;
  e.loss_rows_per_sample = 16;
  e.loss_chunk_rows = 64;
  memory::fit_activations_chunked(2, 1520, 32, 4, 2040, 64, 1360, 16, &e);
  EXPECT_EQ(e.activation_per_chunk_row, 10);
  EXPECT_EQ(e.activation_per_sample, 100);
  EXPECT_EQ(e.activation_fixed, 1000);
  EXPECT_EQ(e.peak(2), 1520);
  EXPECT_EQ(e.peak(4), 2040);
  EXPECT_EQ(e.peak(8), 1000 + 800 + 640) << "128 rows: two full chunks of 64";
  EXPECT_EQ(e.peak(10), 1000 + 1000 + 540) << "160 rows: three chunks of 54";
  EXPECT_THAT(e.describe(10), HasSubstr("the loss's chunk 0.0 MiB (54 rows)"));
  // The largest micro-batch under 3000: 14 (224 rows in 4 chunks of 56: 1000 + 1400 + 560); the
  // line through the first two probes (1000 + 260 per sample) would have said 7.
  EXPECT_EQ(memory::largest_micro_batch(e, 3000, 64), 14);
  // One probe size: no slope to split; the chunk's share still comes off the per-sample part.
  memory::fit_activations_chunked(2, 1520, 32, 2, 1520, 32, 1360, 16, &e);
  EXPECT_EQ(e.activation_per_chunk_row, 10);
  EXPECT_EQ(e.activation_fixed, 0);
  EXPECT_EQ(e.activation_per_sample, 600);
}

TEST(MemoryEstimate, SingleProbeSizeIsAllPerSample) {
  memory::MemoryEstimate e;
  memory::fit_activations(4, 4000, 4, 4000, &e);
  EXPECT_EQ(e.activation_fixed, 0);
  EXPECT_EQ(e.activation_per_sample, 1000);
  memory::fit_activations(4, 4000, 8, 3000, &e);  // noise: a smaller peak for a larger batch
  EXPECT_EQ(e.activation_per_sample, 0);
  EXPECT_EQ(e.activation_fixed, 4000);
}

}  // namespace
