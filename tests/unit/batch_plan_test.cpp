// BatchPlan arithmetic, RankSampler index windows, and the learning-rate schedule, in closed form.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "ddp/batch_plan.h"
#include "ddp/errors.h"
#include "ddp/rank_sampler.h"
#include "train/schedule.h"

namespace {

using ddp::BatchPlan;
using ddp::PlanError;
using ddp::RankSampler;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- BatchPlan ----

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
          const int64_t sum = std::accumulate(p.micro_sizes.begin(), p.micro_sizes.end(), int64_t{0});
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
    EXPECT_THAT(e.what(), HasSubstr("train.global_batch_size = 3 is smaller than the world size 4"));
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

// ---- RankSampler ----

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  EXPECT_EQ(c.scalar_type(), at::kLong);
  EXPECT_EQ(c.dim(), 1);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(RankSampler, StepsPerEpochDropTheTail) {
  EXPECT_EQ(RankSampler(100, 10, 1).steps_per_epoch(), 10);
  EXPECT_EQ(RankSampler(109, 10, 1).steps_per_epoch(), 10);
  EXPECT_EQ(RankSampler(10, 10, 1).steps_per_epoch(), 1);
}

TEST(RankSampler, SameSeedGivesTheSameIndices) {
  RankSampler a(1000, 32, 7);
  RankSampler b(1000, 32, 7);
  for (int64_t step : {0, 1, 30, 31, 32, 100}) {
    EXPECT_EQ(to_vector(a.indices(step, 5, 20)), to_vector(b.indices(step, 5, 20))) << step;
  }
  RankSampler other(1000, 32, 8);
  EXPECT_NE(to_vector(a.indices(0, 0, 32)), to_vector(other.indices(0, 0, 32)));
}

TEST(RankSampler, IndicesAreInRangeAndHaveTheRequestedCount) {
  RankSampler s(50, 8, 3);
  const auto v = to_vector(s.indices(2, 3, 4));
  ASSERT_EQ(v.size(), 4u);
  for (int64_t i : v) {
    EXPECT_GE(i, 0);
    EXPECT_LT(i, 50);
  }
}

TEST(RankSampler, RanksTogetherTakeTheSameWindowAsOneRank) {
  const int64_t n = 500, g = 10;
  RankSampler single(n, g, 99);
  RankSampler shared(n, g, 99);  // one sampler per rank in practice; any world size sees the same
  for (int64_t step : {0, 1, 48, 49, 50, 51, 123}) {
    const auto whole = to_vector(single.indices(step, 0, g));
    std::vector<int64_t> joined;
    for (int r = 0; r < 3; ++r) {
      const BatchPlan p = BatchPlan::make(g, 3, r, 0);
      RankSampler rank_sampler(n, g, 99);
      const auto part = to_vector(rank_sampler.indices(step, p.offset, p.per_rank));
      EXPECT_EQ(part.size(), static_cast<size_t>(p.per_rank));
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, whole) << "step " << step;
    // Slices of the window taken from one sampler agree too.
    EXPECT_EQ(to_vector(shared.indices(step, 4, 3)),
              std::vector<int64_t>(whole.begin() + 4, whole.begin() + 7));
  }
}

TEST(RankSampler, EachEpochIsAPermutation) {
  const int64_t n = 103, g = 10;  // 10 steps an epoch, 3 samples dropped
  RankSampler s(n, g, 5);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t step = epoch * 10; step < (epoch + 1) * 10; ++step) {
      for (int64_t i : to_vector(s.indices(step, 0, g))) {
        EXPECT_GE(i, 0);
        EXPECT_LT(i, n);
        EXPECT_TRUE(seen.insert(i).second) << "index " << i << " repeated in epoch " << epoch;
      }
    }
    EXPECT_EQ(seen.size(), 100u);
  }
}

TEST(RankSampler, EpochsAreShuffledDifferently) {
  RankSampler s(200, 20, 11);
  const auto epoch0 = to_vector(s.indices(0, 0, 20));
  const auto epoch1 = to_vector(s.indices(10, 0, 20));
  const auto epoch2 = to_vector(s.indices(20, 0, 20));
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch1, epoch2);
  EXPECT_NE(epoch0, epoch2);
  // Going back to an earlier epoch gives its indices again.
  EXPECT_EQ(to_vector(s.indices(0, 0, 20)), epoch0);
}

TEST(RankSampler, DatasetSmallerThanTheGlobalBatchIsAPlanError) {
  try {
    RankSampler(9, 10, 1);
    FAIL() << "a sampler for 9 samples and a global batch of 10 was made";
  } catch (const PlanError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the dataset has 9 samples, fewer than one global batch"));
    EXPECT_THAT(e.what(), HasSubstr("train.global_batch_size = 10"));
  }
}

// ---- learning-rate schedule ----

using train::learning_rate;

TEST(LearningRate, WarmupIsLinear) {
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 4, 1.0, 0.1), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(1, 100, 4, 1.0, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(2, 100, 4, 1.0, 0.1), 0.75);
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 10, 0.003, 0.1), 0.0003);
}

TEST(LearningRate, PeakAtTheEndOfWarmup) {
  EXPECT_DOUBLE_EQ(learning_rate(3, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(4, 100, 4, 2.0, 0.1), 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(0, 100, 0, 2.0, 0.1), 2.0);  // no warmup: peak at once
}

TEST(LearningRate, MinimumAtTheLastStep) {
  EXPECT_DOUBLE_EQ(learning_rate(99, 100, 10, 2.0, 0.1), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(49, 50, 0, 1.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(150, 100, 10, 2.0, 0.1), 0.2);  // past the end stays there
}

TEST(LearningRate, CosineHalfwayIsTheMean) {
  // 12 steps, warmup 1: decay over steps 1..11 (10 intervals), halfway at step 6.
  EXPECT_DOUBLE_EQ(learning_rate(6, 12, 1, 1.0, 0.1), 0.55);
}

TEST(LearningRate, DecayIsMonotoneAfterWarmup) {
  const int64_t total = 200, warmup = 20;
  double previous = learning_rate(warmup, total, warmup, 1.0, 0.1);
  for (int64_t step = warmup + 1; step < total; ++step) {
    const double lr = learning_rate(step, total, warmup, 1.0, 0.1);
    EXPECT_LT(lr, previous) << "step " << step;
    EXPECT_GE(lr, 0.1 - 1e-12);
    previous = lr;
  }
  for (int64_t step = 0; step + 1 < warmup; ++step) {
    EXPECT_LT(learning_rate(step, total, warmup, 1.0, 0.1),
              learning_rate(step + 1, total, warmup, 1.0, 0.1));
  }
}

}  // namespace
