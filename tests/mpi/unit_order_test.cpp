// ddp.shard: parameters refuses a model whose order of parameter units changes between steps:
// every rank throws ddp::PlanError naming the recorded order at the same unit, before posting the
// gather that would mismatch, so the job ends with a message instead of hanging.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/registry.h"
#include "ddp/errors.h"
#include "models/capabilities.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

// Three units: a and c (12 -> 12) and the head b (12 -> 5). The first forward runs a, c, b; every
// later one c, a, b.
class Reordering final : public models::Model, public models::ParameterUnits {
 public:
  Reordering() {
    a_ = register_module("a", torch::nn::Linear(12, 12));
    c_ = register_module("c", torch::nn::Linear(12, 12));
    b_ = register_module("b", torch::nn::Linear(12, 5));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x;
    if (gate_ == nullptr) return b_->forward(c_->forward(a_->forward(h)));  // the start-up probe
    const bool first = calls_++ == 0;
    for (const size_t unit : first ? std::vector<size_t>{0, 1} : std::vector<size_t>{1, 0}) {
      gate_->enter(unit);
      h = unit == 0 ? a_->forward(h) : c_->forward(h);
      h = gate_->leave(unit, h);
    }
    gate_->enter(2);
    return gate_->leave(2, b_->forward(h));
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) override {
    return at::cross_entropy_loss(forward(x), y);
  }
  std::vector<std::vector<std::string>> parameter_units() const override {
    return {{"a.weight", "a.bias"}, {"c.weight", "c.bias"}, {"b.weight", "b.bias"}};
  }
  std::vector<size_t> unit_order() const override { return {0, 1, 2}; }  // as step 1 enters them
  void set_unit_gate(models::UnitGate* gate) override { gate_ = gate; }
  models::UnitGate* unit_gate() const override { return gate_; }

 private:
  torch::nn::Linear a_{nullptr}, c_{nullptr}, b_{nullptr};
  models::UnitGate* gate_ = nullptr;
  int calls_ = 0;
};

TEST(UnitOrder, AChangedOrderIsRefusedOnEveryRank) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const auto config = config::parse_config(
      "model: {name: mlp, hidden_dim: 8, depth: 1}\n"
      "data: {num_samples: 200, input_dim: 12, num_classes: 5, teacher_hidden: 8, seed: 7}\n"
      "train: {device: cpu, global_batch_size: 6, steps: 3, lr: 0.01, warmup_steps: 1, seed: 3}\n"
      "memory: {check_every: 0}\n"
      "ddp: {shard: parameters}\n",
      "unit_order.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(3);
  auto model = std::make_shared<Reordering>();
  train::Trainer trainer(config.trainer_options(), *world, *world, model, *dataset,
                         c10::Device(c10::kCPU));
  trainer.step(1);  // records a, c, b
  try {
    trainer.step(2);
    ADD_FAILURE() << "a changed unit order was accepted";
  } catch (const ddp::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("first step's order was [0, 1, 2]"), std::string::npos)
        << e.what();
  }
  world->barrier("every rank refused");
}

}  // namespace TRAINER_UNITY_ID
