// The OOM protocol across ranks (docs/DESIGN.md, "The OOM protocol"): an out-of-memory error on any
// rank, in forward or backward, makes every rank take the next fallback together and re-run the
// same global batch; training then ends with the parameters of a run that never ran out (within
// 1e-5). Past the last rung every rank throws OutOfMemoryFatal: no rank hangs.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "data/registry.h"
#include "memory/allocator_guard.h"
#include "memory/oom.h"
#include "models/capabilities.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;
using trainer_test::relative_error;

struct TrainedRun {
  std::vector<at::Tensor> params;
  int fallbacks = 0;
  int64_t final_micro_batch = 0;
};

TrainedRun train(ddp::Communicator& comm, const std::string& inject,
                 std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), "memory.inject_oom=" + inject);
  const auto config = config::parse_config(R"(
model: {name: mlp, hidden_dim: 32, depth: 2}
data: {num_samples: 4000, input_dim: 10, num_classes: 4, teacher_hidden: 8, seed: 2}
train: {device: cpu, global_batch_size: 96, steps: 12, lr: 0.01, warmup_steps: 2, seed: 9}
)",
                                           "oom.yaml", overrides);
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_injections(comm.rank(), memory::parse_injections(config.memory.inject_oom));
  guard.set_budget(static_cast<int64_t>(config.memory.cpu_budget_mb * 1048576.0));
  struct Reset {
    ~Reset() {
      memory::CpuAllocatorGuard::instance().set_injections(0, {});
      memory::CpuAllocatorGuard::instance().set_budget(0);
    }
  } reset;
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= config.train.steps; ++s) trainer.step(s);
  TrainedRun run;
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().clone());
  run.fallbacks = trainer.fallbacks();
  run.final_micro_batch = trainer.plan().micro_batch;
  return run;
}

class Oom : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = trainer_test::runtime().world(std::chrono::seconds(60));
    if (!reference_) reference_ = std::make_unique<TrainedRun>(train(*comm_, ""));
  }
  std::unique_ptr<ddp::Communicator> comm_;
  static inline std::unique_ptr<TrainedRun> reference_;
};

// Sharded (ddp.shard): the failing rank posts every reduce-scatter the others do (ZeRO-2 allocates
// the buckets it never reached), and the retried step matches the unsharded run.
TEST_F(Oom, ShardedRunsFallBackTogetherAndMatch) {
  const int victim = comm_->size() > 1 ? 1 : 0;
  for (const char* mode : {"optimizer", "gradients"}) {
    for (const char* phase : {"forward", "backward"}) {
      const TrainedRun run =
          train(*comm_, fmt::format("{}:5:{}", victim, phase), {std::string("ddp.shard=") + mode});
      EXPECT_EQ(run.fallbacks, 1) << mode << " " << phase;
      EXPECT_EQ(run.final_micro_batch, reference_->final_micro_batch / 2);
      EXPECT_LT(relative_error(run.params, reference_->params), 1e-5) << mode << " " << phase;
    }
  }
}

TEST_F(Oom, OneRankInBackwardFallsBackAndMatches) {
  const int victim = comm_->size() > 1 ? 1 : 0;
  const TrainedRun run = train(*comm_, fmt::format("{}:5:backward", victim));
  EXPECT_EQ(run.fallbacks, 1);
  EXPECT_EQ(run.final_micro_batch, reference_->final_micro_batch / 2);
  EXPECT_LT(relative_error(run.params, reference_->params), 1e-5);
}

TEST_F(Oom, OneRankInForwardFallsBackAndMatches) {
  const TrainedRun run = train(*comm_, fmt::format("{}:1:forward", comm_->size() - 1));
  EXPECT_EQ(run.fallbacks, 1);
  EXPECT_LT(relative_error(run.params, reference_->params), 1e-5);
}

TEST_F(Oom, AllRanksAtOnceIsOneFallback) {
  std::string inject;
  for (int r = 0; r < comm_->size(); ++r) inject += fmt::format("{}:7:backward;", r);
  const TrainedRun run = train(*comm_, inject);
  EXPECT_EQ(run.fallbacks, 1);
  EXPECT_LT(relative_error(run.params, reference_->params), 1e-5);
}

TEST_F(Oom, RepeatedFailuresHalveAgainUntilItFits) {
  // Rank 0 fails three attempts of step 3: the micro-batch is halved three times.
  const TrainedRun run = train(*comm_, "0:3:forward:3");
  EXPECT_EQ(run.fallbacks, 3);
  EXPECT_EQ(run.final_micro_batch, reference_->final_micro_batch / 8);
  EXPECT_LT(relative_error(run.params, reference_->params), 1e-5);
}

TEST_F(Oom, BelowTheFloorEveryRankFailsWithTheMessage) {
  const int victim = comm_->size() - 1;
  try {
    train(*comm_, fmt::format("{}:4:backward:always", victim), {"memory.min_micro_batch=8"});
    FAIL() << "expected OutOfMemoryFatal on every rank";
  } catch (const memory::OutOfMemoryFatal& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory at step 4 with every fallback spent"));
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank {} in backward (micro-batch 8)", victim)));
    EXPECT_THAT(e.what(), HasSubstr("tried to allocate"));
    EXPECT_THAT(e.what(), HasSubstr("memory.min_micro_batch = 8"));
  }
  // Every rank is still in step: the job can end cleanly.
  comm_->barrier("after fatal OOM");
}

TEST_F(Oom, EmptyLadderFailsAtTheFirstOom) {
  try {
    train(*comm_, "0:2:forward", {"memory.fallback=[]"});
    FAIL() << "expected OutOfMemoryFatal";
  } catch (const memory::OutOfMemoryFatal& e) {
    EXPECT_THAT(e.what(), HasSubstr("memory.fallback = []"));
  }
}

// A real out-of-memory error, not an injected one: a tensor memory budget between what a run
// with the full micro-batch needs and what one with half of it needs. (A wider model than the
// other tests and a larger batch, so that a step's activations make the peak, not the data set-up
// or the optimizer's temporaries.)
TEST_F(Oom, CpuBudgetExceededFallsBackAndMatches) {
  auto& guard = memory::CpuAllocatorGuard::instance();
  const std::string wide = "model.hidden_dim=512";
  const std::string big_batch = "train.global_batch_size=1920";
  TrainedRun unlimited;
  auto peak_of = [&](std::vector<std::string> overrides) {
    guard.reset_peak();
    const int64_t before = guard.allocated_bytes();
    TrainedRun run = train(*comm_, "", std::move(overrides));
    at::Tensor peak = at::tensor({static_cast<double>(guard.peak_bytes() - before)}, at::kDouble);
    comm_->all_reduce(peak, ddp::ReduceOp::kMax);  // one budget for every rank
    return std::make_pair(peak.item<double>(), std::move(run));
  };
  auto [full, reference] = peak_of({wide, big_batch});
  const double half =
      peak_of({wide, big_batch,
               fmt::format("train.micro_batch_size={}", reference.final_micro_batch / 2)})
          .first;
  ASSERT_LT(half, full);
  const double budget_mb = (guard.allocated_bytes() + (full + half) / 2) / 1048576.0;
  // The full micro-batch, given explicitly: the plan for `auto` would avoid the OOM (next test).
  const TrainedRun run =
      train(*comm_, "",
            {wide, big_batch, fmt::format("memory.cpu_budget_mb={}", budget_mb),
             fmt::format("train.micro_batch_size={}", reference.final_micro_batch)});
  EXPECT_EQ(run.fallbacks, 1);
  EXPECT_EQ(run.final_micro_batch, reference.final_micro_batch / 2);
  EXPECT_LT(relative_error(run.params, reference.params), 1e-5);

  // micro_batch_size auto under the same budget: the memory plan picks a micro-batch that fits
  // (the same on every rank), so no step runs out, and the result is the same.
  const TrainedRun planned =
      train(*comm_, "", {wide, big_batch, fmt::format("memory.cpu_budget_mb={}", budget_mb)});
  EXPECT_EQ(planned.fallbacks, 0);
  EXPECT_LT(planned.final_micro_batch, reference.final_micro_batch);
  EXPECT_GE(planned.final_micro_batch, 1);
  at::Tensor micro = at::tensor({planned.final_micro_batch}, at::kLong);
  at::Tensor micro_max = micro.clone();
  comm_->all_reduce(micro_max, ddp::ReduceOp::kMax);
  EXPECT_EQ(micro.item<int64_t>(), micro_max.item<int64_t>())
      << "ranks disagree on the micro-batch";
  EXPECT_LT(relative_error(planned.params, reference.params), 1e-5);
}

TEST_F(Oom, ThirtySeededRandomInjectionsAllCompleteAndMatch) {
  std::mt19937 gen(20261122);  // the same sequence on every rank
  for (int i = 0; i < 30; ++i) {
    const int rank = std::uniform_int_distribution<int>(0, comm_->size() - 1)(gen);
    const int step = std::uniform_int_distribution<int>(1, 12)(gen);
    const char* phase = std::uniform_int_distribution<int>(0, 1)(gen) ? "forward" : "backward";
    const std::string inject = fmt::format("{}:{}:{}", rank, step, phase);
    const TrainedRun run = train(*comm_, inject);
    EXPECT_EQ(run.fallbacks, 1) << inject;
    EXPECT_LT(relative_error(run.params, reference_->params), 1e-5) << inject;
  }
}

}  // namespace TRAINER_UNITY_ID

namespace TRAINER_UNITY_ID {

// The last rung on the model it was made for: once halving is spent, the recommender releases
// its cached item embeddings and computes them per micro-batch; the run matches one that never
// ran out of memory (cached and uncached give the same loss).
std::vector<at::Tensor> train_recommender(ddp::Communicator& comm, const std::string& inject,
                                          bool* cached_at_end) {
  const auto config = config::parse_config(fmt::format(R"(
model: {{name: recommender, embedding_dim: 16, encoder_dim: 32, encoder_layers: 1, encoder_heads: 2, hidden_dim: 16, depth: 1}}
data: {{dataset: movielens, path: {}/data/movielens-sample, text_len: 24}}
train: {{device: cpu, global_batch_size: 48, steps: 6, lr: 0.01, warmup_steps: 1, seed: 4}}
memory: {{min_micro_batch: 48, inject_oom: "{}"}}
)",
                                                       TRAINER_SOURCE_DIR, inject),
                                           "recommender.yaml");
  memory::CpuAllocatorGuard::instance().set_injections(comm.rank(),
                                                       memory::parse_injections(inject));
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= config.train.steps; ++s) trainer.step(s);
  memory::CpuAllocatorGuard::instance().set_injections(0, {});
  *cached_at_end = models::has_cache(*model);
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(OomRecommender, UncacheRungReleasesCachesOnEveryRankAndMatches) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  bool cached = false;
  const auto reference = train_recommender(*comm, "", &cached);
  EXPECT_TRUE(cached);
  // The floor (48) is the whole batch: halving is spent from the start, so the first failure
  // can only uncache.
  const auto run =
      train_recommender(*comm, fmt::format("{}:3:backward", comm->size() - 1), &cached);
  EXPECT_FALSE(cached) << "rank " << comm->rank() << " kept its cache";
  EXPECT_LT(relative_error(run, reference), 1e-5);
}

}  // namespace TRAINER_UNITY_ID
