// The sequence forecaster (LSTM and transformer cells): loss and every gradient against the
// PyTorch reference tests/reference/sequence.py on the same weights, output shapes, parameter
// names, dropout only in training, and the option checks (each error names its config key).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/sequence.h"
#include "reference_harness.h"

namespace TRAINER_UNITY_ID {

using models::SequenceForecaster;
using models::SequenceOptions;
using ::testing::HasSubstr;

SequenceOptions lstm_options() {
  return {.cell = models::SequenceCell::kLstm,
          .features = 3,
          .window = 6,
          .horizon = 2,
          .targets = 2,
          .hidden_dim = 8,
          .num_layers = 2};
}

SequenceOptions transformer_options() {
  return {.cell = models::SequenceCell::kTransformer,
          .features = 3,
          .window = 5,
          .horizon = 2,
          .targets = 2,
          .num_layers = 2,
          .d_model = 8,
          .heads = 2};
}

std::string cell_name(const SequenceOptions& o) {
  return models::kSequenceCellNames.at(static_cast<size_t>(o.cell));
}

std::map<std::string, std::string> meta(const SequenceOptions& o) {
  return {{"cell", cell_name(o)},
          {"features", std::to_string(o.features)},
          {"window", std::to_string(o.window)},
          {"horizon", std::to_string(o.horizon)},
          {"targets", std::to_string(o.targets)},
          {"hidden_dim", std::to_string(o.hidden_dim)},
          {"num_layers", std::to_string(o.num_layers)},
          {"d_model", std::to_string(o.d_model)},
          {"heads", std::to_string(o.heads)}};
}

std::vector<std::string> names(const SequenceForecaster& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters()) out.push_back(item.key());
  return out;
}

// The message of the std::invalid_argument that constructing with `o` throws ("" if none).
std::string construction_error(const SequenceOptions& o) {
  try {
    SequenceForecaster model(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(SequenceReference, LstmTwoLayersMatchesPyTorch) {
  at::manual_seed(1);
  const SequenceOptions o = lstm_options();
  SequenceForecaster model(o);
  const at::Tensor inputs = at::randn({4, o.window, o.features});
  const at::Tensor targets = at::randn({4, o.horizon, o.targets});
  test::expect_matches_reference(model, inputs, targets, "sequence.py", meta(o), 1e-4);
}

TEST(SequenceReference, TransformerTwoBlocksMatchesPyTorch) {
  at::manual_seed(2);
  const SequenceOptions o = transformer_options();
  SequenceForecaster model(o);
  const at::Tensor inputs = at::randn({3, o.window, o.features});
  const at::Tensor targets = at::randn({3, o.horizon, o.targets});
  test::expect_matches_reference(model, inputs, targets, "sequence.py", meta(o), 1e-4);
}

TEST(SequenceShape, OutputIsBatchByHorizonByTargets) {
  for (const SequenceOptions& o : {lstm_options(), transformer_options()}) {
    SequenceForecaster model(o);
    EXPECT_EQ(model.forward(at::randn({5, o.window, o.features})).sizes(),
              (std::vector<int64_t>{5, o.horizon, o.targets}))
        << cell_name(o);
    // Shorter windows work too (the transformer uses the first positions).
    EXPECT_EQ(model.forward(at::randn({1, o.window - 2, o.features})).sizes(),
              (std::vector<int64_t>{1, o.horizon, o.targets}))
        << cell_name(o);
  }
}

TEST(SequenceShape, RejectsWrongInputsAndTargets) {
  SequenceForecaster model(transformer_options());
  EXPECT_THROW(model.forward(at::randn({2, 5, 4})), std::invalid_argument);  // features
  EXPECT_THROW(model.forward(at::randn({2, 6, 3})), std::invalid_argument);  // > window
  EXPECT_THROW(model.loss(at::randn({2, 5, 3}), at::randn({2, 2})), std::invalid_argument);
}

TEST(SequenceNames, LstmParametersAreNamedAsTorchNnLstm) {
  SequenceForecaster model(lstm_options());
  EXPECT_EQ(names(model), (std::vector<std::string>{
                              "lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0",
                              "lstm.bias_hh_l0", "lstm.weight_ih_l1", "lstm.weight_hh_l1",
                              "lstm.bias_ih_l1", "lstm.bias_hh_l1", "head.weight", "head.bias"}));
  const auto params = model.named_parameters();
  EXPECT_EQ(params["lstm.weight_ih_l0"].sizes(), (std::vector<int64_t>{32, 3}));
  EXPECT_EQ(params["lstm.weight_ih_l1"].sizes(), (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(params["head.weight"].sizes(), (std::vector<int64_t>{4, 8}));
}

TEST(SequenceNames, TransformerParametersAreNamedAsTheHeader) {
  SequenceForecaster model(transformer_options());
  // LibTorch lists a module's own parameters before its children's.
  std::vector<std::string> expected = {"pos", "in_proj.weight", "in_proj.bias"};
  for (const std::string b : {"blocks.0.", "blocks.1."}) {
    for (const std::string layer :
         {"ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj"}) {
      expected.push_back(b + layer + ".weight");
      expected.push_back(b + layer + ".bias");
    }
  }
  for (const std::string s : {"ln_f.weight", "ln_f.bias", "head.weight", "head.bias"}) {
    expected.push_back(s);
  }
  EXPECT_EQ(names(model), expected);
  const auto params = model.named_parameters();
  EXPECT_EQ(params["pos"].sizes(), (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(params["blocks.1.attn.qkv.weight"].sizes(), (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(params["blocks.0.mlp.fc.weight"].sizes(), (std::vector<int64_t>{32, 8}));
  EXPECT_TRUE(params["blocks.0.ln_1.weight"].eq(1).all().item<bool>());
  EXPECT_TRUE(params["ln_f.bias"].eq(0).all().item<bool>());
}

TEST(SequenceInit, PositionsAreNormalWithStd002) {
  at::manual_seed(3);
  SequenceOptions o = transformer_options();
  o.window = 64;
  o.d_model = 32;
  SequenceForecaster model(o);
  const double std = model.named_parameters()["pos"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.002);
}

TEST(SequenceDropout, OnlyInTraining) {
  for (SequenceOptions o : {lstm_options(), transformer_options()}) {
    o.dropout = 0.5;
    at::manual_seed(4);
    SequenceForecaster model(o);
    const at::Tensor x = at::randn({4, o.window, o.features});
    model.train();
    EXPECT_FALSE(at::equal(model.forward(x), model.forward(x))) << cell_name(o);
    model.eval();
    EXPECT_TRUE(at::equal(model.forward(x), model.forward(x))) << cell_name(o);
  }
}

TEST(SequenceValidation, ErrorsNameTheConfigKey) {
  SequenceOptions o = lstm_options();
  o.hidden_dim = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("model.hidden_dim"));
  o = lstm_options();
  o.num_layers = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("model.num_layers"));
  o = transformer_options();
  o.heads = 3;
  EXPECT_THAT(construction_error(o), HasSubstr("model.heads (3) must divide model.d_model (8)"));
  o = transformer_options();
  o.d_model = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("model.d_model"));
  o = transformer_options();
  o.window = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("data.window"));
  o = lstm_options();
  o.horizon = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("data.horizon"));
  o = lstm_options();
  o.targets = 0;
  EXPECT_THAT(construction_error(o), HasSubstr("data.targets must name at least one"));
  o = lstm_options();
  o.dropout = 1.0;
  EXPECT_THAT(construction_error(o), HasSubstr("model.dropout"));
  // What does not apply to the cell is not checked: a transformer has no hidden_dim.
  o = transformer_options();
  o.hidden_dim = 0;
  EXPECT_EQ(construction_error(o), "");
}

}  // namespace TRAINER_UNITY_ID
