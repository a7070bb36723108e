// LoRA adapters on llama and gpt (models/lm/lora.h): the loss and every adapter's gradient
// against a PyTorch twin written from LoRA's definition (tests/reference/lora.py) with B away
// from zero, llama with grouped-query attention, an untied output layer and every target, gpt
// with its three; a new adapter changes nothing (step 0 is the base, bitwise); the base is
// frozen (buffers, no gradient) and training moves only the adapters; the merged weights give
// the adapted model's logits; the adapters' names, and the errors that name their keys.
#include "models/lm/lora.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "odd_llama.h"
#include "reference_harness.h"
#include "train/precision.h"

namespace TRAINER_UNITY_ID {

using models::Gpt;
using models::GptOptions;
using models::Llama;
using models::LlamaOptions;
using models::LoraOptions;
using ::testing::HasSubstr;

// 6 query heads over 2 kv heads, each 10 wide, in a 48-wide model; vocabulary 61 (padded 64).
LlamaOptions llama_options() { return test::odd_llama_options(16, false); }

GptOptions gpt_options() {
  GptOptions o;
  o.vocab_size = 50;
  o.context = 16;
  o.num_layers = 2;
  o.heads = 4;
  o.d_model = 32;
  return o;
}

LoraOptions lora(int64_t rank, std::vector<std::string> targets, double alpha = 16.0) {
  return {.rank = rank, .alpha = alpha, .dropout = 0.0, .targets = std::move(targets)};
}

const std::vector<std::string> kLlamaTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};

// B away from zero, as after training (a new adapter's B is zero: no gradient reaches A).
void randomize_b(models::CausalLm& model) {
  at::NoGradGuard no_grad;
  for (const auto& site : model.lora_sites()) site.adapter->b.normal_(0.0, 0.05);
}

std::map<std::string, at::Tensor> frozen_base(models::CausalLm& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value();
  return out;
}

std::map<std::string, std::string> llama_meta(const LlamaOptions& o, const LoraOptions& l) {
  return {{"family", "llama"},
          {"num_layers", std::to_string(o.num_layers)},
          {"heads", std::to_string(o.heads)},
          {"kv_heads", std::to_string(o.kv_heads)},
          {"head_dim", std::to_string(o.head_dim)},
          {"vocab_size", std::to_string(o.vocab_size)},
          {"rms_norm_eps", fmt::format("{}", o.rms_norm_eps)},
          {"rope_theta", fmt::format("{}", o.rope.theta)},
          {"lora_rank", std::to_string(l.rank)},
          {"lora_alpha", fmt::format("{}", l.alpha)}};
}

std::map<std::string, std::string> gpt_meta(const GptOptions& o, const LoraOptions& l) {
  return {{"family", "gpt"},
          {"num_layers", std::to_string(o.num_layers)},
          {"heads", std::to_string(o.heads)},
          {"d_model", std::to_string(o.d_model)},
          {"vocab_size", std::to_string(o.vocab_size)},
          {"lora_rank", std::to_string(l.rank)},
          {"lora_alpha", fmt::format("{}", l.alpha)}};
}

TEST(LoraReference, LlamaLossAndEveryAdapterGradientMatchPyTorch) {
  at::manual_seed(5);
  const LlamaOptions o = llama_options();
  Llama model(o);
  const LoraOptions l = lora(4, kLlamaTargets);
  model.add_lora(l);
  randomize_b(model);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "lora.py", llama_meta(o, l), 1e-4,
                                 frozen_base(model));
}

TEST(LoraReference, LlamaSomeOfTheFusedProjectionMatchesPyTorch) {
  at::manual_seed(6);
  const LlamaOptions o = llama_options();
  Llama model(o);
  const LoraOptions l = lora(3, {"k_proj", "down_proj"}, 6.0);
  model.add_lora(l);
  randomize_b(model);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, 10}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {2, 10}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "lora.py", llama_meta(o, l), 1e-4,
                                 frozen_base(model));
}

TEST(LoraReference, GptLossAndEveryAdapterGradientMatchPyTorch) {
  at::manual_seed(7);
  const GptOptions o = gpt_options();
  Gpt model(o);
  const LoraOptions l = lora(4, {"c_attn", "c_proj", "c_fc"});
  model.add_lora(l);
  randomize_b(model);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "lora.py", gpt_meta(o, l), 1e-4,
                                 frozen_base(model));
}

TEST(Lora, NewAdaptersGiveTheBaseLogitsBitwise) {
  at::manual_seed(8);
  Llama model(llama_options());
  model.eval();
  const at::Tensor tokens = at::randint(0, 61, {2, 12}, at::kLong);
  const at::Tensor base = model.forward(tokens).detach();
  model.add_lora(lora(4, kLlamaTargets));
  EXPECT_TRUE(at::equal(model.forward(tokens), base));
}

TEST(Lora, TheBaseIsFrozenAndOnlyTheAdaptersTrain) {
  at::manual_seed(9);
  Llama model(llama_options());
  int64_t base_count = 0;
  for (const auto& p : model.parameters()) base_count += p.numel();
  model.add_lora(lora(2, {"q_proj", "v_proj"}));
  // The adapters are the only parameters, by PEFT's names; the base is buffers.
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  EXPECT_THAT(
      names,
      ::testing::ElementsAre(
          "layers.0.self_attn.q_proj.lora_A.weight", "layers.0.self_attn.q_proj.lora_B.weight",
          "layers.0.self_attn.v_proj.lora_A.weight", "layers.0.self_attn.v_proj.lora_B.weight",
          "layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_B.weight",
          "layers.1.self_attn.v_proj.lora_A.weight", "layers.1.self_attn.v_proj.lora_B.weight"));
  EXPECT_EQ(models::buffer_count(model), base_count);
  // 2 layers x (q: A [2, 48] + B [60, 2]; v: A [2, 48] + B [20, 2]).
  EXPECT_EQ(models::parameter_count(model), 2 * (2 * 48 + 60 * 2 + 2 * 48 + 20 * 2));
  std::map<std::string, at::Tensor> before;
  for (const auto& item : model.named_buffers()) before[item.key()] = item.value().clone();
  std::map<std::string, at::Tensor> adapters;
  for (const auto& item : model.named_parameters()) adapters[item.key()] = item.value().clone();
  // 50 steps of plain gradient descent on what the model's parameters() are.
  for (int step = 0; step < 50; ++step) {
    const at::Tensor tokens = at::randint(0, 61, {2, 12}, at::kLong);
    model.zero_grad();
    model.loss(tokens, at::roll(tokens, -1, 1)).backward();
    at::NoGradGuard no_grad;
    for (auto& p : model.parameters()) p.sub_(p.grad() * 0.5);
  }
  for (const auto& item : model.named_buffers()) {
    EXPECT_FALSE(item.value().requires_grad()) << item.key();
    EXPECT_TRUE(at::equal(item.value(), before.at(item.key()))) << item.key() << " moved";
  }
  for (const auto& item : model.named_parameters()) {
    EXPECT_FALSE(at::equal(item.value(), adapters.at(item.key()))) << item.key() << " stayed";
  }
}

// Activation checkpointing (the first rung of memory.fallback) with the base frozen: the first
// block's input (the frozen embeddings' output) needs no gradient, and the adapters still get
// theirs, equal to an ordinary backward's.
TEST(Lora, CheckpointedActivationsGiveTheSameAdapterGradients) {
  at::manual_seed(11);
  Llama model(llama_options());
  model.add_lora(lora(4, kLlamaTargets));
  {
    at::NoGradGuard no_grad;  // B is zero at first: give it values so that A's gradient is not 0
    for (const auto& item : model.named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0.0, 0.1);
    }
  }
  const at::Tensor tokens = at::randint(0, 61, {2, 12}, at::kLong);
  const auto gradients = [&](bool checkpointed) {
    model.set_checkpoint_activations(checkpointed);
    model.zero_grad();
    model.loss(tokens, at::roll(tokens, -1, 1)).backward();
    std::vector<at::Tensor> out;
    for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = gradients(false);
  const auto checkpointed = gradients(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_GT(plain[i].abs().max().item<double>(), 0.0) << i;
    EXPECT_TRUE(at::allclose(checkpointed[i], plain[i], 1e-5, 1e-7)) << i;
  }
}

// The loss and the adapters' gradients of one LoRA model (seed 12, B away from zero), with
// `dropout` on the adapters' input, in training; under bf16 autocast when `bf16`.
template <class M, class O>
std::vector<at::Tensor> lora_loss_and_gradients(const O& options, LoraOptions l, double dropout,
                                                bool bf16 = false) {
  at::manual_seed(12);
  M model(options);
  l.dropout = dropout;
  model.add_lora(l);
  randomize_b(model);
  model.train();
  const at::Tensor tokens = at::randint(0, 50, {2, 12}, at::kLong);
  at::Tensor loss;
  {
    train::AutocastScope autocast(c10::Device(c10::kCPU),
                                  bf16 ? train::Precision::kBf16 : train::Precision::kFp32);
    loss = model.loss(tokens, at::roll(tokens, -1, 1));
  }
  loss.backward();
  std::vector<at::Tensor> out{loss.detach()};
  for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
  return out;
}

// With dropout in training, each adapter's middle goes through its own mask and autograd takes
// the rest (Projection::forward's second path): at a rate too small to drop anything, the loss
// and every adapter's gradient are the fused path's (LoraAddmm, which the twin above checks), with
// every target, and with q and v adapted on the fused qkv and k not (B padded onto their rows).
TEST(Lora, TheDropoutPathGivesTheFusedPathsLossAndGradients) {
  for (const auto& targets :
       {kLlamaTargets, std::vector<std::string>{"v_proj", "q_proj", "down_proj"}}) {
    const LoraOptions l = lora(4, targets);
    const auto fused = lora_loss_and_gradients<Llama>(llama_options(), l, 0.0);
    const auto dropped = lora_loss_and_gradients<Llama>(llama_options(), l, 1e-12);
    ASSERT_EQ(fused.size(), dropped.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_GT(fused[i].abs().max().item<double>(), 0.0) << i;
      EXPECT_LT(test::relative_error(dropped[i], fused[i]), 1e-6) << i << " of " << targets.size();
    }
  }
}

// GPT-2's projections add a float32 bias to the bfloat16 product under autocast: the adapters add
// in bfloat16 all the same, and the loss and gradients are float32's within bfloat16's rounding.
TEST(Lora, GptUnderBf16AutocastGivesTheFloat32LossAndGradients) {
  const LoraOptions l = lora(4, {"c_attn", "c_proj", "c_fc"});
  const auto fp32 = lora_loss_and_gradients<Gpt>(gpt_options(), l, 0.0);
  const auto bf16 = lora_loss_and_gradients<Gpt>(gpt_options(), l, 0.0, /*bf16=*/true);
  ASSERT_EQ(fp32.size(), bf16.size());
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_EQ(bf16[i].scalar_type(), at::kFloat) << i;
    EXPECT_LT(test::relative_error(bf16[i], fp32[i]), 5e-2) << i;
  }
}

TEST(Lora, TheMergedWeightsGiveTheAdaptedLogits) {
  at::manual_seed(10);
  const LlamaOptions o = llama_options();
  Llama model(o);
  model.add_lora(lora(4, kLlamaTargets));
  randomize_b(model);
  model.eval();
  Llama merged(o);
  merged.eval();
  {
    at::NoGradGuard no_grad;
    const auto weights = models::merged_weights(model, model.lora_sites());
    auto params = merged.named_parameters();
    ASSERT_EQ(weights.size(), params.size());
    for (const auto& [name, w] : weights) params[name].copy_(w);
  }
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, 12}, at::kLong);
  const at::Tensor want = model.forward(tokens).detach();
  EXPECT_LT(test::relative_error(merged.forward(tokens).detach(), want), 1e-5);
  // And merging moved the logits: the adapters are not zero.
  Llama base(o);
  EXPECT_GT(test::relative_error(base.forward(tokens).detach(), want), 1e-3);
}

// PEFT's scales: alpha / r, and with rsLoRA (use_rslora, model.lora_rslora) alpha / sqrt(r).
TEST(Lora, RsLoraScalesByTheSquareRootOfTheRank) {
  LoraOptions l = lora(4, kLlamaTargets, 12.0);
  EXPECT_DOUBLE_EQ(models::lora_scale(l), 3.0);
  l.rslora = true;
  EXPECT_DOUBLE_EQ(models::lora_scale(l), 6.0);
  Llama model(llama_options());
  model.add_lora(l);
  ASSERT_FALSE(model.lora_sites().empty());
  for (const auto& site : model.lora_sites()) EXPECT_DOUBLE_EQ(site.adapter->scale, 6.0);
}

TEST(LoraErrors, UnknownTargetNamesTheKeyAndTheLayers) {
  Gpt model(gpt_options());
  try {
    model.add_lora(lora(2, {"q_proj"}));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.lora_targets: 'q_proj' matches no layer of gpt"));
    EXPECT_THAT(e.what(), HasSubstr("c_attn, c_proj, c_fc"));
  }
}

TEST(LoraErrors, RankAboveTheSmallerDimensionNamesTheKeyAndTheLayer) {
  Llama model(llama_options());
  // k_proj is 20 rows (2 kv heads x 10) by 48.
  try {
    model.add_lora(lora(21, {"k_proj"}));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.lora_rank: 21 is above the smaller dimension (20) of "
                                    "layers.0.self_attn.k_proj"));
  }
  Llama fits(llama_options());
  EXPECT_NO_THROW(fits.add_lora(lora(20, {"k_proj"})));
}

TEST(LoraErrors, RankZeroWithTargetsNamesTheRank) {
  models::ModelOptions o;
  o.lora_rank = 0;
  o.lora_targets = {"q_proj"};
  EXPECT_THROW(
      {
        try {
          models::lora_options(o);
        } catch (const std::invalid_argument& e) {
          EXPECT_THAT(e.what(), HasSubstr("model.lora_rank: 0"));
          throw;
        }
      },
      std::invalid_argument);
}

TEST(LoraErrors, RsLoraWithRankZeroNamesTheRank) {
  models::ModelOptions o;
  o.lora_rslora = true;
  EXPECT_THAT([&] { models::lora_options(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("model.lora_rank: 0 with model.lora_rslora: true")));
}

}  // namespace TRAINER_UNITY_ID
