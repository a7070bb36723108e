// Multiple-choice evaluation across ranks (train/choice_evaluation.h): the acc and acc_norm counts
// over the world (each rank scoring its contiguous slice, one SUM all-reduce) equal what one
// process counts alone over MPI_COMM_SELF, exactly; with 7 examples (no world size divides them)
// and with 2 (at 3 ranks one rank has none and still takes part: the barrier after it completes).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "models/registry.h"
#include "train/choice_evaluation.h"

namespace TRAINER_UNITY_ID {

std::shared_ptr<models::Model> tiny_gpt() {
  const auto config = config::parse_config(R"(
model: {name: gpt, num_layers: 1, heads: 2, d_model: 16, context: 16}
data: {dataset: tokens, path: unused, context: 16, vocab_size: 50}
train: {device: cpu, global_batch_size: 4, steps: 1, seed: 3}
)",
                                           "choice.yaml");
  core::Shape shape;
  shape.vocab_size = 50;
  shape.context = 16;
  at::manual_seed(3);  // the same weights on every rank
  return models::create_model(config.model, shape);
}

data::ChoiceTask random_task(int64_t examples) {
  at::manual_seed(11);
  data::ChoiceTask task{"random", "random.bin", {}};
  for (int64_t i = 0; i < examples; ++i) {
    data::ChoiceExample e;
    auto ids = [](int64_t n) {
      const at::Tensor t = at::randint(0, 50, {n}, at::kLong);
      return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
    };
    e.context = ids(2 + i % 5);
    for (int64_t k = 0; k < 4; ++k) e.endings.push_back(ids(1 + (i + k) % 4));
    e.label = i % 4;
    task.examples.push_back(std::move(e));
  }
  return task;
}

void expect_world_equals_alone(int64_t examples) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  const auto model = tiny_gpt();
  const data::ChoiceTask task = random_task(examples);
  const train::ChoiceCounts all = train::evaluate_choice_task(*world, *model, task);
  const train::ChoiceCounts alone = train::evaluate_choice_task(*self, *model, task);
  EXPECT_EQ(all.examples, examples);
  EXPECT_EQ(all.acc, alone.acc);
  EXPECT_EQ(all.acc_norm, alone.acc_norm);
  EXPECT_EQ(all.name, "random");
  world->barrier("after the choice evaluation");
}

TEST(ChoiceEvaluation, WorldCountsEqualOneProcessCounts) { expect_world_equals_alone(7); }

TEST(ChoiceEvaluation, RanksWithoutExamplesStillTakePart) { expect_world_equals_alone(2); }

}  // namespace TRAINER_UNITY_ID
