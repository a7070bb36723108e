// The per-rank memory table and its warnings, and a CPU memory sample (memory/memory_stats.h).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/memory_stats.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

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
  EXPECT_THAT(
      table,
      HasSubstr(
          "     1      950    950       n/a    400       410        50      1000   n/a   95%"));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0],
              HasSubstr("rank 1 uses 95% of its memory, above memory.high_watermark = 92%"));
  EXPECT_THAT(warnings[1],
              HasSubstr("rank 1 peaks at 950 MiB of tensors, far above the median rank's 110 MiB"));
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

}  // namespace TRAINER_UNITY_ID
