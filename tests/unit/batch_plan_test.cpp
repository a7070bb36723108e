// BatchPlan arithmetic in closed form: each rank's slice, its micro-batches and their weights.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "ddp/batch_plan.h"
#include "ddp/errors.h"

namespace TRAINER_UNITY_ID {

using ddp::BatchPlan;
using ddp::PlanError;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BatchPlan, EvenSplit) {
  for (int r = 0; r < 4; ++r) {
    const BatchPlan p = BatchPlan::make(64, 4, r, 0);
    EXPECT_EQ(p.global_batch, 64);
    EXPECT_EQ(p.world_size, 4);
    EXPECT_EQ(p.rank, r);
    EXPECT_EQ(p.per_rank, 16);
    EXPECT_EQ(p.offset, 16 * r);
    EXPECT_EQ(p.micro_batch, 16);
    EXPECT_FALSE(p.micro_clamped);
    EXPECT_THAT(p.micro_sizes, ElementsAre(16));
    EXPECT_EQ(p.accumulation(), 1);
  }
}

TEST(BatchPlan, UnevenSplitGivesTheFirstRanksOneMore) {
  const BatchPlan p0 = BatchPlan::make(10, 3, 0, 0);
  const BatchPlan p1 = BatchPlan::make(10, 3, 1, 0);
  const BatchPlan p2 = BatchPlan::make(10, 3, 2, 0);
  EXPECT_EQ(p0.per_rank, 4);
  EXPECT_EQ(p1.per_rank, 3);
  EXPECT_EQ(p2.per_rank, 3);
  EXPECT_EQ(p0.offset, 0);
  EXPECT_EQ(p1.offset, 4);
  EXPECT_EQ(p2.offset, 7);
  EXPECT_EQ(BatchPlan::per_rank_of(10, 3, 0), 4);
  EXPECT_EQ(BatchPlan::per_rank_of(10, 3, 2), 3);
}

TEST(BatchPlan, SlicesTileTheGlobalBatchExactly) {
  for (int64_t g = 1; g <= 64; ++g) {
    for (int w = 1; w <= std::min<int64_t>(g, 9); ++w) {
      int64_t next = 0;
      int64_t largest = 0, smallest = g;
      for (int r = 0; r < w; ++r) {
        const BatchPlan p = BatchPlan::make(g, w, r, 0);
        ASSERT_EQ(p.offset, next) << "G=" << g << " W=" << w << " r=" << r;
        ASSERT_EQ(p.per_rank, BatchPlan::per_rank_of(g, w, r));
        ASSERT_GE(p.per_rank, 1);
        next += p.per_rank;
        largest = std::max(largest, p.per_rank);
        smallest = std::min(smallest, p.per_rank);
      }
      ASSERT_EQ(next, g) << "G=" << g << " W=" << w;
      ASSERT_LE(largest - smallest, 1) << "G=" << g << " W=" << w;
    }
  }
}

TEST(BatchPlan, MicroBatchesSumToThePerRankSlice) {
  for (int64_t g : {7, 12, 100, 257}) {
    for (int w : {1, 2, 3, 5}) {
      for (int64_t m : {1, 2, 3, 4, 7, 1000}) {
        for (int r = 0; r < w; ++r) {
          const BatchPlan p = BatchPlan::make(g, w, r, m);
          const int64_t sum =
              std::accumulate(p.micro_sizes.begin(), p.micro_sizes.end(), int64_t{0});
          ASSERT_EQ(sum, p.per_rank) << "G=" << g << " W=" << w << " r=" << r << " m=" << m;
          const int64_t micro = std::min(m, p.per_rank);
          ASSERT_EQ(p.micro_batch, micro);
          ASSERT_EQ(p.accumulation(), (p.per_rank + micro - 1) / micro);
          for (size_t i = 0; i + 1 < p.micro_sizes.size(); ++i) ASSERT_EQ(p.micro_sizes[i], micro);
          ASSERT_GE(p.micro_sizes.back(), 1);
          ASSERT_LE(p.micro_sizes.back(), micro);
        }
      }
    }
  }
}

TEST(BatchPlan, LastMicroBatchIsSmaller) {
  const BatchPlan p = BatchPlan::make(10, 3, 0, 3);  // 4 samples in micro-batches of 3
  EXPECT_EQ(p.per_rank, 4);
  EXPECT_EQ(p.micro_batch, 3);
  EXPECT_FALSE(p.micro_clamped);
  EXPECT_THAT(p.micro_sizes, ElementsAre(3, 1));
  EXPECT_EQ(p.accumulation(), 2);
  EXPECT_EQ(p.describe(), "4 samples [0, 4) in 2 micro-batch(es) of 3 (last 1)");

  const BatchPlan q = BatchPlan::make(64, 2, 1, 10);  // 32 = 10 + 10 + 10 + 2
  EXPECT_THAT(q.micro_sizes, ElementsAre(10, 10, 10, 2));
  EXPECT_EQ(q.describe(), "32 samples [32, 64) in 4 micro-batch(es) of 10 (last 2)");
}

TEST(BatchPlan, ExactMultipleHasEqualMicroBatches) {
  const BatchPlan p = BatchPlan::make(48, 2, 0, 8);
  EXPECT_THAT(p.micro_sizes, ElementsAre(8, 8, 8));
  EXPECT_EQ(p.describe(), "24 samples [0, 24) in 3 micro-batch(es) of 8");
}

TEST(BatchPlan, MicroBatchLargerThanTheSliceIsClamped) {
  const BatchPlan p = BatchPlan::make(10, 3, 1, 5);  // per-rank 3
  EXPECT_EQ(p.per_rank, 3);
  EXPECT_EQ(p.micro_batch, 3);
  EXPECT_TRUE(p.micro_clamped);
  EXPECT_THAT(p.micro_sizes, ElementsAre(3));
  // Equal to the slice is not clamping.
  EXPECT_FALSE(BatchPlan::make(10, 3, 1, 3).micro_clamped);
}

TEST(BatchPlan, AutoMicroBatchIsTheWholeSlice) {
  for (int64_t auto_value : {0, -1}) {
    const BatchPlan p = BatchPlan::make(10, 3, 0, auto_value);
    EXPECT_EQ(p.micro_batch, 4);
    EXPECT_FALSE(p.micro_clamped);
    EXPECT_THAT(p.micro_sizes, ElementsAre(4));
    EXPECT_EQ(p.describe(), "4 samples [0, 4) in 1 micro-batch(es) of 4");
  }
}

TEST(BatchPlan, WorldLargerThanTheGlobalBatchIsAPlanError) {
  try {
    BatchPlan::make(3, 4, 0, 0);
    FAIL() << "a plan for 4 ranks and 3 samples was made";
  } catch (const PlanError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("train.global_batch_size = 3 is smaller than the world size 4"));
  }
  EXPECT_NO_THROW(BatchPlan::make(4, 4, 3, 0));
}

TEST(BatchPlan, InvalidRankOrBatchIsAPlanError) {
  EXPECT_THROW(BatchPlan::make(8, 2, 2, 0), PlanError);
  EXPECT_THROW(BatchPlan::make(8, 2, -1, 0), PlanError);
  EXPECT_THROW(BatchPlan::make(8, 0, 0, 0), PlanError);
  EXPECT_THROW(BatchPlan::make(0, 1, 0, 0), PlanError);
}

TEST(BatchPlan, WeightsOfEveryMicroBatchOfEveryRankSumToOne) {
  for (int64_t g : {1, 10, 33, 256}) {
    for (int w : {1, 2, 3, 7}) {
      if (w > g) continue;
      for (int64_t m : {0, 1, 3, 16}) {
        double total = 0;
        for (int r = 0; r < w; ++r) {
          const BatchPlan p = BatchPlan::make(g, w, r, m);
          for (int64_t n : p.micro_sizes) total += p.weight(n);
        }
        EXPECT_NEAR(total, 1.0, 1e-12) << "G=" << g << " W=" << w << " m=" << m;
      }
    }
  }
  EXPECT_DOUBLE_EQ(BatchPlan::make(10, 3, 0, 3).weight(3), 0.3);
}

// ddp.shard: parameters: every rank runs the largest rank's number of micro-batches, which still
// sum to its slice; a slice shorter than that count gets empty micro-batches first.
TEST(BatchPlan, EqualizedMicroBatchCountsAreTheSameOnEveryRank) {
  for (const int world : {2, 3, 4}) {
    for (const int64_t global : {7, 13, 16}) {
      for (const int64_t micro : {0, 1, 2, 3}) {  // 0: the whole slice (auto)
        const size_t count = [&] {
          ddp::BatchPlan first = ddp::BatchPlan::make(global, world, 0, micro);
          first.equalize_micro_batches(micro);
          return first.micro_sizes.size();
        }();
        for (int r = 0; r < world; ++r) {
          ddp::BatchPlan p = ddp::BatchPlan::make(global, world, r, micro);
          const size_t before = p.micro_sizes.size();
          p.equalize_micro_batches(micro);
          EXPECT_EQ(p.micro_sizes.size(), count) << global << " on " << world << ", rank " << r;
          EXPECT_GE(p.micro_sizes.size(), before);
          EXPECT_EQ(std::accumulate(p.micro_sizes.begin(), p.micro_sizes.end(), int64_t{0}),
                    p.per_rank);
          for (const int64_t n : p.micro_sizes) EXPECT_LE(n, p.micro_batch);
          if (p.per_rank >= static_cast<int64_t>(count)) {
            EXPECT_THAT(p.micro_sizes, ::testing::Each(::testing::Gt(0)));
          }
        }
      }
    }
  }
  // 7 samples on 2 ranks in micro-batches of 1: rank 1's 3 samples become [0, 1, 1, 1].
  ddp::BatchPlan p = ddp::BatchPlan::make(7, 2, 1, 1);
  p.equalize_micro_batches(1);
  EXPECT_THAT(p.micro_sizes, ::testing::ElementsAre(0, 1, 1, 1));
}

}  // namespace TRAINER_UNITY_ID
