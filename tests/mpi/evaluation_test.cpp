// Distributed ranking evaluation: HR@10 and NDCG@10 computed over the world (each rank scoring its
// slice of the held-out users, one SUM all-reduce) equal what one process computes alone over
// MPI_COMM_SELF, to 1e-9, on a model trained a few steps by the Trainer (so every rank holds the
// same weights). Also with more ranks than held-out users: a rank with an empty slice still takes
// part in the all-reduce and gets the same result.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/movielens.h"
#include "data/registry.h"
#include "models/registry.h"
#include "train/evaluation.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

const std::string kSample = std::string(TRAINER_SOURCE_DIR) + "/data/movielens-sample";

struct Trained {
  std::unique_ptr<data::Dataset> dataset;
  std::shared_ptr<models::Model> model;
};

Trained train_recommender(ddp::Communicator& comm, const std::string& data_path, int64_t steps) {
  const auto config = config::parse_config(fmt::format(R"(
model: {{name: recommender, embedding_dim: 16, encoder_dim: 32, encoder_layers: 1, encoder_heads: 2, hidden_dim: 16, depth: 1}}
data: {{dataset: movielens, path: {}, text_len: 24, negatives: 2}}
train: {{device: cpu, global_batch_size: 6, steps: {}, lr: 0.01, warmup_steps: 1, seed: 4}}
)",
                                                       data_path, steps),
                                           "evaluation.yaml");
  Trained t;
  t.dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  t.model = models::create_model(config.model, t.dataset->shape());
  train::Trainer trainer(config.trainer_options(), comm, comm, t.model, *t.dataset,
                         c10::Device(c10::kCPU));
  for (int64_t s = 1; s <= steps; ++s) trainer.step(s);
  return t;
}

TEST(Evaluation, WorldMetricsEqualOneProcessMetrics) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const auto t = train_recommender(*world, kSample, 8);
  const auto all = train::evaluate_ranking(*world, *t.model, *t.dataset, 10);
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const auto alone = train::evaluate_ranking(*self, *t.model, *t.dataset, 10);
  EXPECT_EQ(all.users, 300);
  EXPECT_EQ(alone.users, 300);
  EXPECT_NEAR(all.hit_rate, alone.hit_rate, 1e-9);
  EXPECT_NEAR(all.ndcg, alone.ndcg, 1e-9);
  EXPECT_GT(all.hit_rate, 0.0);
  EXPECT_LE(all.ndcg, all.hit_rate);
  // Every rank returns the same numbers (rank 0's, broadcast, compared here).
  at::Tensor mine = at::tensor({all.hit_rate, all.ndcg}, at::kDouble);
  at::Tensor rank0 = mine.clone();
  world->broadcast(rank0, 0, "rank 0's metrics");
  EXPECT_TRUE(at::equal(mine, rank0)) << "rank " << world->rank();
}

TEST(Evaluation, RanksWithoutHeldOutUsersStillTakePart) {
  // Two held-out users (1 and 2) for 2 or 3 ranks: rank 2 of 3 has an empty slice.
  test::TempDir dir;  // one per rank
  std::ofstream(dir.file("movies.dat")) << "1::A (1990)::Drama\n2::B (1991)::War\n"
                                           "3::C (1992)::Comedy\n4::D (1993)::Horror\n";
  std::ofstream(dir.file("ratings.dat")) << "1::1::5::1\n1::2::5::2\n1::3::5::3\n"
                                            "2::4::5::1\n2::1::5::2\n3::2::4::1\n";
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const auto t = train_recommender(*world, dir.path(), 2);
  const auto all = train::evaluate_ranking(*world, *t.model, *t.dataset, 2);
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const auto alone = train::evaluate_ranking(*self, *t.model, *t.dataset, 2);
  EXPECT_EQ(all.users, 2);
  EXPECT_NEAR(all.hit_rate, alone.hit_rate, 1e-9);
  EXPECT_NEAR(all.ndcg, alone.ndcg, 1e-9);
  world->barrier("after evaluation");
}

}  // namespace TRAINER_UNITY_ID
