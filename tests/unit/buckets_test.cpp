// Bucket assignment (ddp/buckets.h): reverse parameter order, a small first bucket, caps, dtypes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "ddp/buckets.h"

namespace TRAINER_UNITY_ID {

using ddp::assign_buckets;
using ddp::BucketLayout;
using ddp::ParamMeta;
using ::testing::ElementsAre;

ParamMeta f32(int64_t numel) { return {numel, at::kFloat, c10::Device(c10::kCPU)}; }

std::vector<std::vector<size_t>> members(const std::vector<BucketLayout>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets) out.push_back(b.params);
  return out;
}

TEST(Buckets, ReverseOrderFirstBucketSmallRestLarger) {
  // 6 params of 100 floats (400 B). First cap 800 B (2 params), then 1200 B (3 params).
  const auto buckets = assign_buckets(std::vector<ParamMeta>(6, f32(100)), 800, 1200);
  EXPECT_THAT(members(buckets),
              ElementsAre(ElementsAre(5, 4), ElementsAre(3, 2, 1), ElementsAre(0)));
  EXPECT_THAT(buckets[0].offsets, ElementsAre(0, 100));
  EXPECT_EQ(buckets[1].numel, 300);
  EXPECT_EQ(buckets[1].bytes(), 1200);
}

TEST(Buckets, ParameterLargerThanTheCapGetsItsOwnBucket) {
  const auto buckets = assign_buckets({f32(10), f32(1000), f32(10), f32(10)}, 100, 100);
  EXPECT_THAT(members(buckets), ElementsAre(ElementsAre(3, 2), ElementsAre(1), ElementsAre(0)));
  EXPECT_EQ(buckets[1].bytes(), 4000);
}

TEST(Buckets, OneBucketWhenTheCapsAreHuge) {
  const auto buckets = assign_buckets(std::vector<ParamMeta>(5, f32(1000)), 1LL << 40, 1LL << 40);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_THAT(buckets[0].params, ElementsAre(4, 3, 2, 1, 0));
  EXPECT_THAT(buckets[0].offsets, ElementsAre(0, 1000, 2000, 3000, 4000));
}

TEST(Buckets, MixedDtypesNeverShareABucket) {
  const ParamMeta half{100, at::kHalf, c10::Device(c10::kCPU)};
  const auto buckets = assign_buckets({f32(100), half, f32(100), half}, 1 << 20, 1 << 20);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].dtype, at::kHalf);  // param 3 comes first in reverse order
  EXPECT_THAT(buckets[0].params, ElementsAre(3, 1));
  EXPECT_EQ(buckets[1].dtype, at::kFloat);
  EXPECT_THAT(buckets[1].params, ElementsAre(2, 0));
  EXPECT_EQ(buckets[0].bytes(), 400);
}

TEST(Buckets, EveryParameterExactlyOnceAndCapsRespected) {
  std::vector<ParamMeta> params;
  for (int i = 0; i < 50; ++i) params.push_back(f32(1 + (i * 37) % 300));
  const auto buckets = assign_buckets(params, 500, 2000);
  std::vector<int> seen(params.size(), 0);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t cap = b == 0 ? 500 : 2000;
    if (buckets[b].params.size() > 1) {
      EXPECT_LE(buckets[b].bytes(), cap) << "bucket " << b;
    }
    for (size_t k : buckets[b].params) ++seen[k];
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

}  // namespace TRAINER_UNITY_ID
