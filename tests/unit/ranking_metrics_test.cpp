// Ranking metrics in closed form: HR@k and NDCG@k from hand-picked ranks, the held-out rank with
// training items masked, evaluate_ranking through the Dataset and Model hooks alone (a hand-made
// task and score table), and on the MovieLens sample against a brute-force loop (one process, a
// fake communicator: one all-reduce, nothing for other datasets or models).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <set>
#include <utility>

#include "data/movielens.h"
#include "data/registry.h"
#include "fake_communicator.h"
#include "models/capabilities.h"
#include "models/recommender.h"
#include "models/registry.h"
#include "train/evaluation.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using train::ranking_metrics_from_ranks;

TEST(RankingMetrics, HitRateAndNdcgInClosedForm) {
  const at::Tensor ranks = at::tensor({0, 1, 9, 10, 50}, at::kLong);
  const auto m = ranking_metrics_from_ranks(ranks, 10);
  EXPECT_EQ(m.users, 5);
  EXPECT_DOUBLE_EQ(m.hit_rate, 3.0 / 5);  // ranks 0, 1 and 9 are in the top 10
  EXPECT_NEAR(m.ndcg, (1.0 + 1.0 / std::log2(3.0) + 1.0 / std::log2(11.0)) / 5, 1e-12);

  const auto top1 = ranking_metrics_from_ranks(ranks, 1);
  EXPECT_DOUBLE_EQ(top1.hit_rate, 0.2);
  EXPECT_DOUBLE_EQ(top1.ndcg, 0.2);  // rank 0: 1 / log2(2) = 1

  const auto all = ranking_metrics_from_ranks(ranks, 51);
  EXPECT_DOUBLE_EQ(all.hit_rate, 1.0);
  EXPECT_NEAR(all.ndcg,
              (1.0 + 1.0 / std::log2(3.0) + 1.0 / std::log2(11.0) + 1.0 / std::log2(12.0) +
               1.0 / std::log2(52.0)) /
                  5,
              1e-12);
}

TEST(RankingMetrics, NoUsersGivesZerosAndKMustBePositive) {
  const auto m = ranking_metrics_from_ranks(at::empty({0}, at::kLong), 10);
  EXPECT_EQ(m.users, 0);
  EXPECT_EQ(m.hit_rate, 0);
  EXPECT_EQ(m.ndcg, 0);
  EXPECT_THROW(ranking_metrics_from_ranks(at::tensor({0}, at::kLong), 0), std::invalid_argument);
}

TEST(RankingMetrics, HeldOutRankSkipsTrainingItemsButNotItself) {
  const at::Tensor scores = at::tensor({0.5f, 0.9f, 0.1f, 0.7f,   // row 0: held-out item 0
                                        0.3f, 0.2f, 0.8f, 0.1f})  // row 1: held-out item 1
                                .view({2, 4});
  const at::Tensor before = scores.clone();
  const at::Tensor held = at::tensor({0, 1}, at::kLong);
  // Nothing masked: row 0 has 0.9 and 0.7 above 0.5; row 1 has 0.3 and 0.8 above 0.2.
  const at::Tensor none = at::empty({0}, at::kLong);
  EXPECT_TRUE(
      at::equal(train::held_out_ranks(scores, held, none, none), at::tensor({2, 2}, at::kLong)));
  // Row 0 saw item 1 (0.9, masked); row 1 saw items 2 (0.8, masked) and 1, its held-out item,
  // which still competes with its own score.
  const at::Tensor rows = at::tensor({0, 1, 1}, at::kLong);
  const at::Tensor items = at::tensor({1, 2, 1}, at::kLong);
  EXPECT_TRUE(
      at::equal(train::held_out_ranks(scores, held, rows, items), at::tensor({1, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(scores, before));  // scores untouched
}

// A dataset that is nothing but a ranking task: 3 users, 5 items.
class TaskOnly final : public data::Dataset {
 public:
  int64_t size() const override { return 0; }
  core::Shape shape() const override { return {}; }
  data::Batch get(const at::Tensor&) const override { return {}; }
  std::optional<data::RankingTask> ranking_task() const override {
    // (user, held-out item); the training pairs, among them user 2's own held-out item 0.
    return data::RankingTask{at::tensor({0, 1, 1, 4, 2, 0}, at::kLong).view({3, 2}),
                             at::tensor({0, 3, 1, 0, 2, 1, 2, 0}, at::kLong).view({4, 2}), 3, 5};
  }
};

// A model that does not score items.
class PlainModel : public models::Model {
 public:
  at::Tensor forward(const at::Tensor& inputs) override { return inputs; }
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor&) override { return inputs.sum(); }
};

// A model that scores items from a fixed table.
class TableScorer final : public PlainModel, public models::ItemScorer {
 public:
  at::Tensor score_all(const at::Tensor& users) override {
    const at::Tensor table = at::tensor({0.1f, 0.5f, 0.3f, 0.9f, 0.2f,   // user 0
                                         0.8f, 0.7f, 0.6f, 0.5f, 0.4f,   // user 1
                                         0.2f, 0.4f, 0.6f, 0.8f, 0.1f})  // user 2
                                 .view({3, 5});
    return table.index_select(0, users);
  }
};

TEST(RankingMetrics, EvaluateRankingThroughTheDatasetAndModelHooks) {
  // User 0: held-out 0.5, only item 3 (0.9) above it, masked: rank 0. User 1: held-out 0.4,
  // items 1-3 above it (item 0, 0.8, masked): rank 3. User 2: held-out 0.2, items 1-3 above it,
  // item 1 masked (its own held-out item 0 still competes): rank 2.
  // HR@3 = 2/3; NDCG@3 = (1 / log2(2) + 1 / log2(4)) / 3 = 0.5.
  const TaskOnly data;
  TableScorer model;
  trainer_test::FakeCommunicator comm;
  const auto m = train::evaluate_ranking(comm, model, data, 3);
  EXPECT_EQ(m.users, 3);
  EXPECT_NEAR(m.hit_rate, 2.0 / 3, 1e-12);
  EXPECT_NEAR(m.ndcg, 0.5, 1e-12);
  ASSERT_EQ(comm.ops.size(), 1u);
  EXPECT_EQ(comm.ops[0].kind, "all_reduce");

  // What the trainer logs and records: the same numbers, as hr@10 and ndcg@10 over the users.
  const auto logged = train::evaluate_and_log(comm, model, data, 1, 8, 0);
  EXPECT_EQ(logged.samples, 3);
  ASSERT_EQ(logged.means.size(), 2u);
  EXPECT_EQ(logged.means[0].first, "hr@10");
  EXPECT_DOUBLE_EQ(logged.means[0].second, 1.0);  // every held-out item ranks in the top 10

  // A model that does not score items is not evaluated, and nothing is communicated.
  PlainModel other;
  trainer_test::FakeCommunicator quiet;
  EXPECT_EQ(train::evaluate_ranking(quiet, other, data, 3).users, 0);
  EXPECT_EQ(train::evaluate_and_log(quiet, other, data, 1, 8, 0).samples, 0);
  EXPECT_TRUE(quiet.ops.empty());
}

std::shared_ptr<models::Model> small_recommender(const data::MovieLensDataset& ds) {
  models::ModelOptions o;
  o.name = "recommender";
  o.hidden_dim = 16;
  o.depth = 1;
  o.embedding_dim = 16;
  o.encoder_dim = 16;
  o.encoder_layers = 1;
  o.encoder_heads = 2;
  at::manual_seed(5);
  auto model = models::create_model(o, ds.shape());
  models::as<models::EmbeddingCache>(*model)->build_cache();
  return model;
}

TEST(RankingMetrics, EvaluateRankingMatchesABruteForceLoop) {
  const data::MovieLensDataset ds(std::string(TRAINER_SOURCE_DIR) + "/data/movielens-sample", 24,
                                  1);
  auto model = small_recommender(ds);
  auto& rec = dynamic_cast<models::Recommender&>(*model);

  // Brute force: each held-out user's rank among the items it has not trained on.
  std::vector<std::set<int64_t>> seen(ds.num_users());
  const at::Tensor inter = ds.train_interactions();
  for (int64_t i = 0; i < inter.size(0); ++i) {
    seen[inter[i][0].item<int64_t>()].insert(inter[i][1].item<int64_t>());
  }
  const at::Tensor held = ds.held_out();
  const at::Tensor scores = rec.score_all(held.select(1, 0).contiguous());
  std::vector<int64_t> ranks;
  for (int64_t u = 0; u < held.size(0); ++u) {
    const int64_t user = held[u][0].item<int64_t>(), item = held[u][1].item<int64_t>();
    const auto row = scores[u].contiguous();
    const float* s = row.data_ptr<float>();
    int64_t rank = 0;
    for (int64_t j = 0; j < ds.num_items(); ++j) {
      if (j != item && !seen[user].count(j) && s[j] > s[item]) ++rank;
    }
    ranks.push_back(rank);
  }
  const auto expected = ranking_metrics_from_ranks(at::tensor(ranks, at::kLong), 10);

  trainer_test::FakeCommunicator comm;
  const auto m = train::evaluate_ranking(comm, *model, ds, 10);
  EXPECT_EQ(m.users, 300);
  EXPECT_NEAR(m.hit_rate, expected.hit_rate, 1e-12);
  EXPECT_NEAR(m.ndcg, expected.ndcg, 1e-12);
  EXPECT_GT(m.hit_rate, 0.0);  // an untrained model still places some items in the top 10
  ASSERT_EQ(comm.ops.size(), 1u);
  EXPECT_EQ(comm.ops[0].kind, "all_reduce");
  EXPECT_EQ(comm.ops[0].numel, 3);
}

TEST(RankingMetrics, OtherDatasetsAreNotEvaluated) {
  data::DataOptions o;
  o.dataset = "synthetic";
  o.num_samples = 16;
  o.input_dim = 4;
  o.num_classes = 2;
  o.teacher_hidden = 4;
  const auto synthetic = data::make_dataset(o);
  const data::MovieLensDataset ml(std::string(TRAINER_SOURCE_DIR) + "/data/movielens-sample", 24,
                                  1);
  auto model = small_recommender(ml);
  trainer_test::FakeCommunicator comm;
  const auto m = train::evaluate_ranking(comm, *model, *synthetic, 10);
  EXPECT_EQ(m.users, 0);
  EXPECT_TRUE(comm.ops.empty());
}

}  // namespace TRAINER_UNITY_ID
