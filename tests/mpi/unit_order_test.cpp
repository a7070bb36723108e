// ddp.shard: parameters and a model's units:
// - a model whose order of parameter units changes between steps is refused: every rank throws
//   ddp::PlanError naming the recorded order at the same unit, before posting the gather that
//   would mismatch, so the job ends with a message instead of hanging;
// - a unit's frozen tensors (LoRA's base: ddp::ReducerOptions::frozen) are sharded with it,
//   gathered for its forward and backward, and freed once backward has passed the unit; frozen
//   embeddings are not gathered for backward at all.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "common/mpi_test_env.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/registry.h"
#include "ddp/errors.h"
#include "models/capabilities.h"
#include "models/deferred_init.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

// A run under ddp.shard: parameters on 12 features and 5 classes (the model is the test's).
config::Config units_config() {
  return config::parse_config(
      "model: {name: mlp, hidden_dim: 8, depth: 1}\n"
      "data: {num_samples: 200, input_dim: 12, num_classes: 5, teacher_hidden: 8, seed: 7}\n"
      "train: {device: cpu, global_batch_size: 6, steps: 3, lr: 0.01, warmup_steps: 1, seed: 3}\n"
      "memory: {check_every: 0}\n"
      "ddp: {shard: parameters}\n",
      "units.yaml");
}

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
  const config::Config config = units_config();
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

// LoRA's shape in six units: frozen embeddings without parameters (unit 0); four blocks of a
// frozen norm weight and a frozen 12 x 12 matrix with a trainable low-rank adapter beside it (the
// adapter's gradients land before the norm's weight is used for the gradient of the block's
// input); the frozen head, without parameters.
class FrozenChain final : public models::Model, public models::ParameterUnits {
 public:
  static constexpr size_t kUnits = 6;
  FrozenChain() {
    weights_.push_back(register_buffer("emb_w", at::randn({12, 12}) / 4));
    for (size_t u = 1; u + 1 < kUnits; ++u) {
      const std::string p = "u" + std::to_string(u) + "_";
      norms_.push_back(register_buffer(p + "norm", 0.5 + at::rand({12})));
      weights_.push_back(register_buffer(p + "w", at::randn({12, 12}) / 4));
      a_.push_back(register_parameter(p + "lora_a", at::randn({2, 12}) / 4));
      b_.push_back(register_parameter(p + "lora_b", at::randn({12, 2}) / 4));
    }
    weights_.push_back(register_buffer("head_w", at::randn({5, 12}) / 4));
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (gate_ != nullptr) gate_->enter(0);
    at::Tensor h = x.matmul(weights_[0].t());
    if (gate_ != nullptr) h = gate_->leave(0, h);
    for (size_t u = 1; u + 1 < kUnits; ++u) {
      if (gate_ != nullptr) gate_->enter(u);
      const at::Tensor n = h * norms_[u - 1];
      h = at::tanh(n.matmul(weights_[u].t()) + n.matmul(a_[u - 1].t()).matmul(b_[u - 1].t()));
      // Its gradient comes once backward has entered this block: what is gathered then.
      if (gate_ != nullptr) h.register_hook([this](const at::Tensor&) { count_gathered(); });
      if (gate_ != nullptr) h = gate_->leave(u, h);
    }
    if (gate_ != nullptr) gate_->enter(kUnits - 1);
    const at::Tensor logits = h.matmul(weights_.back().t());
    return gate_ != nullptr ? gate_->leave(kUnits - 1, logits) : logits;
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) override {
    return at::cross_entropy_loss(forward(x), y);
  }
  std::vector<std::vector<std::string>> parameter_units() const override {
    std::vector<std::vector<std::string>> units(kUnits);
    for (size_t u = 1; u + 1 < kUnits; ++u) {
      units[u] = {"u" + std::to_string(u) + "_lora_a", "u" + std::to_string(u) + "_lora_b"};
    }
    return units;
  }
  std::vector<std::vector<std::string>> frozen_units() const override {
    std::vector<std::vector<std::string>> units(kUnits);
    units.front() = {"emb_w"};
    for (size_t u = 1; u + 1 < kUnits; ++u) {
      units[u] = {"u" + std::to_string(u) + "_norm", "u" + std::to_string(u) + "_w"};
    }
    units.back() = {"head_w"};
    return units;
  }
  std::vector<size_t> unit_order() const override { return {0, 1, 2, 3, 4, 5}; }
  void set_unit_gate(models::UnitGate* gate) override { gate_ = gate; }
  models::UnitGate* unit_gate() const override { return gate_; }

  int64_t units_holding_frozen() const {
    int64_t n = 0;
    for (const auto& w : weights_) n += models::holds_no_storage(w) ? 0 : 1;
    return n;
  }
  int64_t most_gathered_in_backward = 0;
  bool embeddings_gathered_in_backward = false;

 private:
  void count_gathered() {
    most_gathered_in_backward = std::max(most_gathered_in_backward, units_holding_frozen());
    embeddings_gathered_in_backward |= !models::holds_no_storage(weights_.front());
  }
  std::vector<at::Tensor> norms_, weights_, a_, b_;
  models::UnitGate* gate_ = nullptr;
};

TEST(FrozenUnits, ShardedWithTheirUnitAndFreedOnceBackwardPassedIt) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  const config::Config config = units_config();
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(3);
  auto model = std::make_shared<FrozenChain>();
  std::vector<at::Tensor> frozen;
  for (const auto& b : model->buffers()) frozen.push_back(b.clone());
  const at::Tensor adapter = model->parameters()[0].detach().clone();
  train::Trainer trainer(config.trainer_options(), *world, *world, model, *dataset,
                         c10::Device(c10::kCPU));
  EXPECT_EQ(model->units_holding_frozen(), 0) << "the frozen tensors are whole on every rank";
  // The memory plan counts them whole under the other modes, as blocks and two units here.
  int64_t frozen_bytes = 0;
  for (const auto& b : frozen) frozen_bytes += b.nbytes();
  EXPECT_GE(trainer.footprint(ddp::ShardMode::kNone).parameters, frozen_bytes);
  EXPECT_GE(trainer.footprint(ddp::ShardMode::kGradients).parameters, frozen_bytes);
  EXPECT_LT(trainer.footprint(ddp::ShardMode::kParameters).parameters,
            trainer.footprint(ddp::ShardMode::kNone).parameters);
  for (int64_t s = 1; s <= 3; ++s) trainer.step(s);
  // Backward holds the unit it is in and the one prefetched before it, never what it has passed,
  // and never the embeddings, through which it does not run.
  EXPECT_GT(model->most_gathered_in_backward, 0);
  EXPECT_LE(model->most_gathered_in_backward, 2);
  EXPECT_FALSE(model->embeddings_gathered_in_backward);
  EXPECT_EQ(model->units_holding_frozen(), 0);
  const auto pinned = trainer_test::pin_parameters(trainer);
  EXPECT_EQ(model->units_holding_frozen(), static_cast<int64_t>(FrozenChain::kUnits));
  const auto after = model->buffers();
  for (size_t i = 0; i < frozen.size(); ++i) EXPECT_TRUE(at::equal(after[i], frozen[i])) << i;
  EXPECT_FALSE(at::equal(model->parameters()[0], adapter)) << "the adapters did not train";
}

}  // namespace TRAINER_UNITY_ID
