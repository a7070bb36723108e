// The gpt model: the loss and every gradient against an independent PyTorch implementation
// (tests/reference/gpt.py), GPT-2's names, shapes, parameter count and initialisation, activation
// checkpointing that changes memory and nothing else (same loss, gradients, dropout masks, random
// stream and autocast precision; each post-accumulate-grad hook once per backward), and option
// errors that name their config keys.
#include "models/gpt/gpt.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/allocator_guard.h"
#include "memory/memory_stats.h"
#include "models/registry.h"
#include "reference_harness.h"
#include "train/precision.h"

namespace TRAINER_UNITY_ID {

using models::Gpt;
using models::GptOptions;
using ::testing::HasSubstr;

// Vocabulary 61 pads to 64: the padded rows must stay out of the loss.
GptOptions small_options() {
  GptOptions o;
  o.vocab_size = 61;
  o.context = 16;
  o.num_layers = 2;
  o.heads = 4;
  o.d_model = 32;
  return o;
}

std::map<std::string, std::string> meta(const GptOptions& o) {
  return {{"num_layers", std::to_string(o.num_layers)},
          {"heads", std::to_string(o.heads)},
          {"d_model", std::to_string(o.d_model)},
          {"vocab_size", std::to_string(o.vocab_size)}};
}

std::vector<std::string> names(const Gpt& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters()) out.push_back(item.key());
  return out;
}

int64_t parameter_count(const Gpt& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// GPT-2's count: wte (padded, tied), wpe, per block 12 d^2 + 13 d, ln_f.
int64_t expected_parameters(const GptOptions& o, int64_t padded_vocab) {
  const int64_t d = o.d_model;
  return padded_vocab * d + o.context * d + o.num_layers * (12 * d * d + 13 * d) + 2 * d;
}

// Loss and a copy of every gradient after one forward + backward from a fresh seed.
struct Step {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
};

Step step(Gpt& model, const at::Tensor& tokens, const at::Tensor& targets, uint64_t seed,
          bool bf16 = false) {
  model.zero_grad();
  at::manual_seed(seed);
  Step s;
  {
    train::AutocastScope autocast(c10::Device(c10::kCPU),
                                  bf16 ? train::Precision::kBf16 : train::Precision::kFp32);
    s.loss = model.loss(tokens, targets);
  }
  s.loss.backward();
  s.loss = s.loss.detach();
  for (const auto& item : model.named_parameters()) {
    s.grads[item.key()] = item.value().grad().clone();
  }
  return s;
}

void expect_same(const Step& a, const Step& b, double tolerance) {
  EXPECT_LT(test::relative_error(a.loss, b.loss), tolerance)
      << a.loss.item<double>() << " vs " << b.loss.item<double>();
  for (const auto& [name, grad] : b.grads) {
    ASSERT_TRUE(a.grads.count(name)) << name;
    EXPECT_LT(test::relative_error(a.grads.at(name), grad), tolerance) << "gradient of " << name;
  }
}

// Counts post-accumulate-grad hook calls, as the Reducer's ReadyHook sees them.
class CountingHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit CountingHook(int* count) : count_(count) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { ++*count_; }

 private:
  int* count_;
};

TEST(GptReference, LossAndEveryGradientMatchPyTorch) {
  at::manual_seed(3);
  const GptOptions o = small_options();
  Gpt model(o);
  const at::Tensor tokens = at::randint(o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "gpt.py", meta(o), 1e-4);
}

TEST(GptReference, LossAndEveryGradientMatchPyTorchWithCheckpointing) {
  at::manual_seed(3);
  GptOptions o = small_options();
  o.checkpoint_activations = true;
  Gpt model(o);
  ASSERT_TRUE(model.checkpoint_activations());
  const at::Tensor tokens = at::randint(o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "gpt.py", meta(o), 1e-4);
}

// The output layer in chunks of 6 positions (36 in all) against the same unchunked reference.
TEST(GptReference, LossAndEveryGradientMatchPyTorchWithAChunkedOutputLayer) {
  at::manual_seed(3);
  GptOptions o = small_options();
  o.loss_chunk_rows = 7;
  Gpt model(o);
  const at::Tensor tokens = at::randint(o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "gpt.py", meta(o), 1e-4);
}

TEST(GptShape, ParameterNamesAreGpt2sWithOneTiedEmbedding) {
  Gpt model(small_options());
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    for (const char* name :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      expected.push_back("h." + std::to_string(i) + "." + name);
    }
  }
  expected.push_back("ln_f.weight");
  expected.push_back("ln_f.bias");
  EXPECT_EQ(names(model), expected);  // no separate output projection
  const auto p = model.named_parameters();
  EXPECT_EQ(p["wte.weight"].sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(p["wpe.weight"].sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(p["h.0.attn.c_attn.weight"].sizes(), (std::vector<int64_t>{96, 32}));  // [out, in]
  EXPECT_EQ(p["h.1.mlp.c_proj.weight"].sizes(), (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(parameter_count(model), expected_parameters(small_options(), 64));
}

// The language-model base's units (models/lm/causal_lm.h) on gpt's parts: the embeddings and
// the tied output layer's ln_f in unit 0, then block i alone in unit 1 + i.
TEST(GptShape, ParameterUnitsAreTheEmbeddingsThenEachBlock) {
  const GptOptions o = small_options();
  Gpt model(o);
  const auto units = model.parameter_units();
  ASSERT_EQ(units.size(), static_cast<size_t>(1 + o.num_layers));
  EXPECT_EQ(units[0],
            (std::vector<std::string>{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}));
  for (size_t u = 1; u < units.size(); ++u) {
    EXPECT_EQ(units[u].size(), 12u);  // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj: weight, bias
    for (const auto& name : units[u]) {
      EXPECT_EQ(name.rfind("h." + std::to_string(u - 1) + ".", 0), 0u) << name;
    }
  }
}

TEST(GptShape, LogitsHaveThePaddedWidthAndPaddedRowsGetNoGradient) {
  at::manual_seed(4);
  Gpt model(small_options());
  EXPECT_EQ(model.options().padded_vocab_size, 64);
  const at::Tensor tokens = at::randint(61, {2, 7}, at::kLong);
  EXPECT_EQ(model.forward(tokens).sizes(), (std::vector<int64_t>{2, 7, 64}));
  model.loss(tokens, at::randint(61, {2, 7}, at::kLong)).backward();
  // Rows 61..63 of wte are neither looked up (tokens < 61) nor predicted (columns dropped).
  const at::Tensor grad = model.named_parameters()["wte.weight"].grad();
  EXPECT_EQ(grad.narrow(0, 61, 3).abs().max().item<float>(), 0.0f);
  EXPECT_GT(grad.narrow(0, 0, 61).abs().max().item<float>(), 0.0f);

  GptOptions o = small_options();
  o.padded_vocab_size = 100;  // an explicit padding is kept as given
  Gpt wide(o);
  EXPECT_EQ(wide.forward(tokens).size(2), 100);
  EXPECT_EQ(wide.named_parameters()["wte.weight"].size(0), 100);
}

TEST(GptShape, PresetsHaveTheirDimensions) {
  const GptOptions gpt2 = models::gpt_preset("gpt2");
  EXPECT_EQ(std::vector<int64_t>(
                {gpt2.num_layers, gpt2.heads, gpt2.d_model, gpt2.context, gpt2.vocab_size}),
            std::vector<int64_t>({12, 12, 768, 1024, 50257}));
  const GptOptions medium = models::gpt_preset("gpt2-medium");
  EXPECT_EQ(std::vector<int64_t>({medium.num_layers, medium.heads, medium.d_model, medium.context,
                                  medium.vocab_size}),
            std::vector<int64_t>({24, 16, 1024, 1024, 50257}));
  const GptOptions tiny = models::gpt_preset("tiny");
  EXPECT_EQ(std::vector<int64_t>(
                {tiny.num_layers, tiny.heads, tiny.d_model, tiny.context, tiny.vocab_size}),
            std::vector<int64_t>({2, 4, 64, 64, 256}));
  EXPECT_EQ(models::gpt_preset_names(), (std::vector<std::string>{"gpt2", "gpt2-medium", "tiny"}));
  Gpt model(tiny);
  EXPECT_EQ(parameter_count(model), expected_parameters(tiny, 256));
}

// GPT-2 small: 124,439,808 parameters with its 50257-row embedding, 124,475,904 padded to 50304.
TEST(GptShape, Gpt2HasGpt2sParameterCountAndInitialisation) {
  const GptOptions o = models::gpt_preset("gpt2");
  EXPECT_EQ(expected_parameters(o, 50257), 124439808);
  EXPECT_EQ(expected_parameters(o, 50304), 124475904);
  at::manual_seed(0);
  const auto start = std::chrono::steady_clock::now();
  Gpt model(o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("gpt2 (124M) built in %.2f s\n", seconds);
  EXPECT_EQ(model.options().padded_vocab_size, 50304);
  EXPECT_EQ(parameter_count(model), 124475904);

  auto p = model.named_parameters();
  const auto std_of = [&](const std::string& name) { return p[name].std().item<double>(); };
  const double residual = 0.02 / std::sqrt(2.0 * 12);  // 0.00408
  EXPECT_NEAR(std_of("h.3.attn.c_proj.weight"), residual, 0.02 * residual);
  EXPECT_NEAR(std_of("h.11.mlp.c_proj.weight"), residual, 0.02 * residual);
  EXPECT_NEAR(std_of("h.0.attn.c_attn.weight"), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(std_of("h.7.mlp.c_fc.weight"), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(std_of("wte.weight"), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(std_of("wpe.weight"), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(p["h.0.mlp.c_fc.weight"].mean().item<double>(), 0.0, 1e-4);
  EXPECT_EQ(p["h.5.attn.c_attn.bias"].abs().max().item<float>(), 0.0f);
  EXPECT_EQ(p["h.5.mlp.c_proj.bias"].abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(p["h.2.ln_1.weight"].eq(1).all().item<bool>());
  EXPECT_TRUE(p["ln_f.bias"].eq(0).all().item<bool>());
  // PaLM's estimate, nanoGPT's N (without wpe): 6 N + 12 L d T.
  EXPECT_DOUBLE_EQ(model.flops_per_token(1024),
                   6.0 * double(124475904 - 1024 * 768) + 12.0 * 12 * 768 * 1024);
}

TEST(GptCheckpoint, IsSupportedAndReportsItsState) {
  Gpt model(small_options());
  models::Model& any = model;
  ASSERT_NE(models::as<models::ActivationCheckpointing>(any), nullptr);  // the trainer's probe
  EXPECT_FALSE(model.checkpoint_activations());
  model.set_checkpoint_activations(true);
  EXPECT_TRUE(model.checkpoint_activations());
  EXPECT_TRUE(models::checkpoints_activations(any));
}

// Dropout on: the recompute must draw the masks of the first run, and leave the random stream
// where the plain run leaves it.
TEST(GptCheckpoint, SameLossGradientsAndRandomStreamWithDropout) {
  GptOptions o = small_options();
  o.dropout = 0.1;
  at::manual_seed(5);
  Gpt model(o);
  ASSERT_TRUE(model.is_training());
  at::manual_seed(6);
  const at::Tensor tokens = at::randint(61, {4, 16}, at::kLong);
  const at::Tensor targets = at::randint(61, {4, 16}, at::kLong);

  model.set_checkpoint_activations(false);
  const Step plain = step(model, tokens, targets, 9);
  const at::Tensor after_plain = at::rand({8});
  model.set_checkpoint_activations(true);
  const Step checkpointed = step(model, tokens, targets, 9);
  const at::Tensor after_checkpointed = at::rand({8});
  expect_same(checkpointed, plain, 1e-6);
  EXPECT_TRUE(at::equal(after_plain, after_checkpointed));

  // Dropout is really on: another seed gives another loss.
  const Step other = step(model, tokens, targets, 10);
  EXPECT_NE(other.loss.item<double>(), plain.loss.item<double>());
}

// Backward runs outside the trainer's autocast scope; the recompute must still run in bf16.
TEST(GptCheckpoint, RecomputesInTheForwardsAutocastPrecision) {
  at::manual_seed(7);
  Gpt model(small_options());
  const at::Tensor tokens = at::randint(61, {3, 16}, at::kLong);
  const at::Tensor targets = at::randint(61, {3, 16}, at::kLong);
  model.set_checkpoint_activations(false);
  const Step plain = step(model, tokens, targets, 1, /*bf16=*/true);
  const Step fp32 = step(model, tokens, targets, 1, /*bf16=*/false);
  model.set_checkpoint_activations(true);
  const Step checkpointed = step(model, tokens, targets, 1, /*bf16=*/true);
  expect_same(checkpointed, plain, 1e-6);
  // The check can tell: bf16 and fp32 gradients differ by far more than the tolerance.
  EXPECT_GT(test::relative_error(plain.grads.at("h.0.attn.c_attn.weight"),
                                 fp32.grads.at("h.0.attn.c_attn.weight")),
            1e-4);
}

TEST(GptCheckpoint, EachPostAccumulateGradHookFiresOncePerBackward) {
  GptOptions o = small_options();
  o.checkpoint_activations = true;
  at::manual_seed(8);
  Gpt model(o);
  const auto params = model.named_parameters();
  std::vector<int> counts(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].value(),
                                                   std::make_unique<CountingHook>(&counts[i]));
  }
  const at::Tensor tokens = at::randint(61, {2, 16}, at::kLong);
  for (int backward = 1; backward <= 2; ++backward) {
    model.loss(tokens, tokens).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(counts[i], backward) << params[i].key() << " after backward " << backward;
    }
  }
  for (const auto& item : params) {
    torch::autograd::impl::set_post_acc_grad_hooks(item.value(), nullptr);
  }
}

// The peak of forward + backward, measured as the trainer's activation probe does.
TEST(GptCheckpoint, LowersThePeakMemoryOfForwardAndBackward) {
  memory::CpuAllocatorGuard::instance();  // CPU tensor bytes are counted once it is installed
  const c10::Device cpu(c10::kCPU);
  GptOptions o = small_options();
  o.vocab_size = 64;  // small logits: the blocks' activations dominate
  o.num_layers = 6;
  o.d_model = 64;
  o.context = 64;
  at::manual_seed(2);
  Gpt model(o);
  const at::Tensor tokens = at::randint(64, {16, 64}, at::kLong);
  const auto peak = [&](bool checkpointing) {
    model.set_checkpoint_activations(checkpointing);
    model.zero_grad();  // to none: both runs allocate their gradients
    memory::reset_peaks(cpu);
    const int64_t base = memory::sample_memory(cpu).tensor_bytes;
    model.loss(tokens, tokens).backward();
    return memory::sample_memory(cpu).tensor_peak_bytes - base;
  };
  peak(false);  // warm-up: nothing lazy in the measured runs
  const int64_t without = peak(false), with = peak(true);
  std::printf("forward + backward peak: %.2f MiB without checkpointing, %.2f MiB with\n",
              double(without) / (1 << 20), double(with) / (1 << 20));
  EXPECT_GT(without, 0);
  EXPECT_LT(with, without / 2);
}

// Without a graph (evaluation) there is nothing to recompute: blocks run as usual, and the
// outputs are the same either way.
TEST(GptCheckpoint, EvaluationGivesTheSameLogits) {
  at::manual_seed(11);
  GptOptions o = small_options();
  o.dropout = 0.1;
  Gpt model(o);
  model.eval();
  const at::Tensor tokens = at::randint(61, {2, 16}, at::kLong);
  at::Tensor plain, checkpointed, with_grad;
  {
    at::NoGradGuard no_grad;
    model.set_checkpoint_activations(false);
    plain = model.forward(tokens);
    model.set_checkpoint_activations(true);
    checkpointed = model.forward(tokens);
  }
  with_grad = model.forward(tokens);  // eval mode, grad on: checkpointed, dropout off
  EXPECT_TRUE(at::equal(plain, checkpointed));
  EXPECT_TRUE(at::allclose(plain, with_grad.detach(), 1e-6, 1e-6));
  EXPECT_FALSE(checkpointed.requires_grad());
  EXPECT_TRUE(with_grad.requires_grad());
}

TEST(GptOptions, InconsistentOptionsNameTheirKeys) {
  const auto message = [](const GptOptions& o) {
    try {
      Gpt model(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GptOptions o = small_options();
  o.heads = 5;
  EXPECT_THAT(message(o), HasSubstr("model.heads (5) must divide model.d_model (32)"));
  o = small_options();
  o.heads = 0;
  EXPECT_THAT(message(o), HasSubstr("model.heads"));
  o = small_options();
  o.d_model = 0;
  EXPECT_THAT(message(o), HasSubstr("model.d_model"));
  o = small_options();
  o.num_layers = 0;
  EXPECT_THAT(message(o), HasSubstr("model.num_layers"));
  o = small_options();
  o.context = 0;
  EXPECT_THAT(message(o), HasSubstr("model.context"));
  o = small_options();
  o.vocab_size = 0;
  EXPECT_THAT(message(o), HasSubstr("data.vocab_size"));
  o = small_options();
  o.dropout = 1.0;
  EXPECT_THAT(message(o), HasSubstr("model.dropout"));
  o = small_options();
  o.padded_vocab_size = 60;
  EXPECT_THAT(message(o), HasSubstr("padded_vocab_size (60)"));
}

TEST(GptOptions, UnknownPresetNamesTheKeyAndThePresets) {
  try {
    models::gpt_preset("gpt5");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.preset"));
    EXPECT_THAT(e.what(), HasSubstr("'gpt5'"));
    EXPECT_THAT(e.what(), HasSubstr("gpt2, gpt2-medium, tiny"));
  }
}

TEST(GptOptions, InputsLongerThanTheContextAreRejected) {
  Gpt model(small_options());
  try {
    model.forward(at::zeros({1, 17}, at::kLong));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.context = 16"));
  }
  EXPECT_THROW(model.forward(at::zeros({1, 4}, at::kFloat)), std::invalid_argument);
  EXPECT_THROW(model.loss(at::zeros({1, 4}, at::kLong), at::zeros({1, 5}, at::kLong)),
               std::invalid_argument);
}

// A data.context longer than the model's positions stops training (create_model), but not the
// commands that read no data (create_language_model: --generate, --export-hf, --export-peft),
// for gpt and llama alike.
TEST(GptOptions, DataContextIsCheckedOnlyWhereDataIsRead) {
  for (const char* name : {"gpt", "llama"}) {
    SCOPED_TRACE(name);
    models::ModelOptions o;
    o.name = name;
    o.preset = name == std::string("gpt") ? "tiny" : "llama-tiny";
    o.context = 16;
    core::Shape s;
    s.vocab_size = 61;
    s.context = 32;
    EXPECT_THAT([&] { models::create_model(o, s); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr(
                    "data.context = 32 is longer than model.context = 16 (the positions")));
    const auto lm = models::create_language_model(o, s, "--export-hf");
    EXPECT_EQ(lm->context(), 16);
  }
}

}  // namespace TRAINER_UNITY_ID
