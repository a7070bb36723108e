// Per-step seeds (train/step_rng.h): a pure function of (seed, step, rank), distinct across
// nearby steps and ranks (also in the low 32 bits, all the CPU generator keeps), and reseeding
// replays the same draws whatever was drawn before.
#include "train/step_rng.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

#include "core/splitmix.h"

namespace TRAINER_UNITY_ID {

// Known answers, computed apart from the code under test (Python, from the contract in
// step_rng.h: splitmix64 chained over seed ^ "STEPRAND", step, rank), so a change of the formula
// or of splitmix64 (whose first output for 0 is the published 0xe220a8397b1dcdaf) shows here.
TEST(StepRng, SeedsAreSplitmixChainedOverSeedStepAndRank) {
  EXPECT_EQ(core::splitmix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(train::step_seed(42, 7, 1), 0x20dbc73b8f203fc2ULL);
  EXPECT_EQ(train::step_seed(42, 7, 0), 0x07e9892bb0804eb1ULL);
  EXPECT_EQ(train::step_seed(0, 0, 0), 0x79bd28277adcceefULL);
  EXPECT_EQ(train::step_seed(1234567, 100000, 7), 0xc79660aef934dae6ULL);
}

TEST(StepRng, SeedsAreAFunctionOfSeedStepAndRank) {
  EXPECT_NE(train::step_seed(42, 7, 1), train::step_seed(42, 7, 0));
  EXPECT_NE(train::step_seed(42, 7, 1), train::step_seed(42, 8, 1));
  EXPECT_NE(train::step_seed(42, 7, 1), train::step_seed(43, 7, 1));
  // seed + step + rank would collide here.
  EXPECT_NE(train::step_seed(42, 7, 1), train::step_seed(42, 6, 2));
  EXPECT_NE(train::step_seed(42, 7, 1), train::step_seed(41, 8, 1));
}

TEST(StepRng, NoCollisionsOverAGridOfStepsAndRanks) {
  std::set<uint32_t> low;  // the bits the CPU generator keeps
  int n = 0;
  for (int64_t step = 0; step < 2000; ++step) {
    for (int rank = 0; rank < 8; ++rank, ++n) {
      low.insert(static_cast<uint32_t>(train::step_seed(42, step, rank)));
    }
  }
  // 16000 draws from 2^32: a collision has probability ~3%; allow one.
  EXPECT_GE(static_cast<int>(low.size()), n - 1);
}

TEST(StepRng, ReseedingReplaysTheDrawsWhateverCameBefore) {
  const c10::Device cpu(c10::kCPU);
  train::seed_step_generators(42, 5, 1, cpu);
  const at::Tensor a = at::rand({64});
  // What it draws is what a fresh generator seeded with step_seed draws.
  EXPECT_TRUE(at::equal(
      a, at::rand({64}, at::make_generator<at::CPUGeneratorImpl>(train::step_seed(42, 5, 1)))));
  const at::Tensor an = at::randn({3});  // leaves a cached normal sample behind
  at::rand({1000});                      // the stream moves on
  train::seed_step_generators(42, 5, 1, cpu);
  EXPECT_TRUE(at::equal(at::rand({64}), a));
  EXPECT_TRUE(at::equal(at::randn({3}), an));
  train::seed_step_generators(42, 5, 0, cpu);
  EXPECT_FALSE(at::equal(at::rand({64}), a));
  train::seed_step_generators(42, 6, 1, cpu);
  EXPECT_FALSE(at::equal(at::rand({64}), a));
  // Dropout draws from it too.
  train::seed_step_generators(42, 5, 1, cpu);
  const at::Tensor mask = at::dropout(at::ones({256}), 0.5, true);
  train::seed_step_generators(42, 5, 1, cpu);
  EXPECT_TRUE(at::equal(at::dropout(at::ones({256}), 0.5, true), mask));
}

}  // namespace TRAINER_UNITY_ID
