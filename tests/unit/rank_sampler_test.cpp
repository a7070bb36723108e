// RankSampler's index windows in closed form: every rank's share (its BatchPlan slice) of each
// epoch's permutation.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "ddp/batch_plan.h"
#include "ddp/errors.h"
#include "ddp/rank_sampler.h"

namespace TRAINER_UNITY_ID {

using ddp::BatchPlan;
using ddp::PlanError;
using ddp::RankSampler;
using ::testing::HasSubstr;

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

}  // namespace TRAINER_UNITY_ID
