// The memory plan's arithmetic (memory/estimator.h): the peak it adds up, the largest micro-batch
// that fits, and the activation line fitted through the probe's two sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "memory/estimator.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

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

// An asynchronous checkpoint's host copy (ddp.shard: parameters on CPU) is part of the peak and
// named in the plan's line; a micro-batch that fits without it may not fit with it.
TEST(MemoryEstimate, CheckpointHostCopyCountsInThePeak) {
  memory::MemoryEstimate e;
  e.parameters = 4000;
  e.activation_per_sample = 100;
  EXPECT_EQ(e.peak(2), 4200);
  EXPECT_THAT(e.describe(2), ::testing::Not(HasSubstr("checkpoint host copy")));
  e.checkpoint_copy = 3 * 1048576;
  EXPECT_EQ(e.peak(2), 4200 + 3 * 1048576);
  EXPECT_THAT(e.describe(2), HasSubstr("checkpoint host copy 3.0 MiB, "));
  EXPECT_EQ(memory::largest_micro_batch(e, 4000 + 3 * 1048576 + 100 * 5, 64), 5);
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

}  // namespace TRAINER_UNITY_ID
