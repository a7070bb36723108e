// The llama model: the loss and every gradient against an independent PyTorch implementation
// (tests/reference/llama.py) on odd shapes (heads not a power of two, grouped-query attention,
// head_dim apart from d_model / heads, tied and untied, with and without the llama3 rope
// scaling, with biases), the same with activation checkpointing and a chunked output layer;
// Hugging Face's names and the parameter count; KV-cache decoding against the whole sequence;
// the presets' sizes; and option errors that name their config keys.
#include "models/llama/llama.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "odd_llama.h"
#include "reference_harness.h"

namespace TRAINER_UNITY_ID {

using models::Llama;
using models::LlamaOptions;
using ::testing::HasSubstr;

// Vocabulary 61 pads to 64: the padded rows must stay out of the loss. 6 heads over 2 kv heads,
// each 10 wide, in a 48-wide model.
LlamaOptions odd_options() { return test::odd_llama_options(16, true); }

std::map<std::string, std::string> meta(const Llama& model) {
  const LlamaOptions& o = model.options();
  std::map<std::string, std::string> m = {{"num_layers", std::to_string(o.num_layers)},
                                          {"heads", std::to_string(o.heads)},
                                          {"kv_heads", std::to_string(o.kv_heads)},
                                          {"head_dim", std::to_string(o.head_dim)},
                                          {"vocab_size", std::to_string(o.vocab_size)},
                                          {"rms_norm_eps", fmt::format("{}", o.rms_norm_eps)},
                                          {"rope_theta", fmt::format("{}", o.rope.theta)}};
  if (o.rope.scaling == "llama3") {
    m["rope_factor"] = fmt::format("{}", o.rope.factor);
    m["rope_low_freq_factor"] = fmt::format("{}", o.rope.low_freq_factor);
    m["rope_high_freq_factor"] = fmt::format("{}", o.rope.high_freq_factor);
    m["rope_original_context"] = std::to_string(o.rope.original_context);
  }
  return m;
}

// Norms away from one and biases away from zero, as after training.
void perturb(Llama& model) {
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (item.key().find("norm") != std::string::npos ||
        item.key().find("bias") != std::string::npos) {
      item.value().add_(at::randn_like(item.value()) * 0.1);
    }
  }
}

void expect_matches(LlamaOptions o, uint64_t seed) {
  at::manual_seed(seed);
  Llama model(o);
  perturb(model);
  const at::Tensor tokens = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  const at::Tensor targets = at::randint(0, o.vocab_size, {3, 12}, at::kLong);
  test::expect_matches_reference(model, tokens, targets, "llama.py", meta(model), 1e-4);
}

TEST(LlamaReference, LossAndEveryGradientMatchPyTorchTiedWithGroupedQueries) {
  expect_matches(odd_options(), 1);
}

TEST(LlamaReference, UntiedWithRopeScalingBiasesAndCheckpointingAndChunks) {
  LlamaOptions o = odd_options();
  o.tie_embeddings = false;
  o.attention_bias = true;
  o.mlp_bias = true;
  o.rope.scaling = "llama3";
  o.rope.original_context = 8;  // the three bands of wavelengths all occur at theta 100
  o.checkpoint_activations = true;
  o.loss_chunk_rows = 7;
  expect_matches(o, 2);
}

TEST(Llama, HuggingFaceNamesAndCount) {
  LlamaOptions o = odd_options();
  o.tie_embeddings = false;
  Llama model(o);
  std::vector<std::string> names;
  int64_t count = 0;
  for (const auto& item : model.named_parameters()) {
    names.push_back(item.key());
    count += item.value().numel();
  }
  EXPECT_THAT(names,
              ::testing::ElementsAre(
                  "embed_tokens.weight", "layers.0.input_layernorm.weight",
                  "layers.0.self_attn.qkv_proj.weight", "layers.0.self_attn.o_proj.weight",
                  "layers.0.post_attention_layernorm.weight", "layers.0.mlp.gate_proj.weight",
                  "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                  "layers.1.input_layernorm.weight", "layers.1.self_attn.qkv_proj.weight",
                  "layers.1.self_attn.o_proj.weight", "layers.1.post_attention_layernorm.weight",
                  "layers.1.mlp.gate_proj.weight", "layers.1.mlp.up_proj.weight",
                  "layers.1.mlp.down_proj.weight", "norm.weight", "lm_head.weight"));
  const int64_t d = 48, attn = 60, kv = 20, inter = 72;
  const int64_t block = d + (attn + 2 * kv) * d + attn * d + d + 3 * d * inter;
  EXPECT_EQ(count, 2 * 64 * d + 2 * block + d);
}

// The language-model base's glue (models/lm/causal_lm.h) on llama's parts. FLOPs per token:
// 6 N + 12 L A T with A = heads x head_dim and N counting embed_tokens only where it is also the
// output layer. Units: embed_tokens, each block, then norm and lm_head apart when untied (tied:
// norm joins embed_tokens' unit, which the output layer enters again).
TEST(Llama, FlopsAndParameterUnitsTiedAndUntied) {
  for (const bool tied : {true, false}) {
    LlamaOptions o = odd_options();
    o.tie_embeddings = tied;
    Llama model(o);
    size_t parameters = 0;
    int64_t count = 0;
    for (const auto& p : model.parameters()) {
      count += p.numel();
      ++parameters;
    }
    const int64_t looked_up = tied ? 0 : 64 * 48;  // embed_tokens [64, 48] when untied
    EXPECT_DOUBLE_EQ(model.flops_per_token(12),
                     6.0 * double(count - looked_up) + 12.0 * 2 * (6 * 10) * 12)
        << "tied " << tied;
    const auto units = model.parameter_units();
    ASSERT_EQ(units.size(), tied ? 3u : 4u);
    const std::vector<std::string> first =
        tied ? std::vector<std::string>{"embed_tokens.weight", "norm.weight"}
             : std::vector<std::string>{"embed_tokens.weight"};
    EXPECT_EQ(units[0], first);
    if (!tied) {
      EXPECT_EQ(units[3], (std::vector<std::string>{"norm.weight", "lm_head.weight"}));
    }
    size_t in_units = 0;
    for (size_t u = 1; u <= 2; ++u) {
      for (const auto& name : units[u]) {
        EXPECT_EQ(name.rfind("layers." + std::to_string(u - 1) + ".", 0), 0u) << name;
      }
    }
    for (const auto& unit : units) in_units += unit.size();
    EXPECT_EQ(in_units, parameters);
  }
}

TEST(Llama, KvCacheEqualsTheWholeSequence) {
  LlamaOptions o = odd_options();
  o.rope.scaling = "llama3";
  o.rope.original_context = 8;
  at::manual_seed(3);
  Llama model(o);
  model.eval();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, o.vocab_size, {2, 16}, at::kLong);
  const at::Tensor full = model.forward(tokens);
  models::KvCache cache;
  std::vector<at::Tensor> parts;
  for (const auto& [start, len] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 1}, {6, 10}}) {
    parts.push_back(model.forward_cached(tokens.narrow(1, start, len), cache));
  }
  EXPECT_EQ(cache.length(), 16);
  EXPECT_EQ(cache.keys[0].size(1), 2);  // kv heads, not query heads, are cached
  EXPECT_LT((at::cat(parts, 1) - full).abs().max().item<double>(), 1e-5);
  EXPECT_THROW(model.forward_cached(tokens.narrow(1, 0, 1), cache), std::invalid_argument);
}

TEST(Llama, PresetsHaveTheirSizes) {
  const auto count = [](const std::string& name) {
    LlamaOptions o = models::llama_preset(name);
    o.context = 8;
    int64_t n = 0;
    for (const auto& p : Llama(o).parameters()) n += p.numel();
    return n;
  };
  EXPECT_EQ(count("llama-tiny"), 2967808);
  // SmolLM-135M: 134,515,008 parameters with its 49,152-row embedding (a multiple of 64).
  EXPECT_EQ(count("smollm-135m"), 134515008);
  const LlamaOptions big = models::llama_preset("llama-3.2-1b");
  EXPECT_EQ(big.rope.scaling, "llama3");
  EXPECT_EQ(big.rope.factor, 32.0);
  EXPECT_EQ(big.d_model / big.heads, 64);
  EXPECT_THROW(models::llama_preset("gpt2"), std::invalid_argument);
}

TEST(Llama, OptionErrorsNameTheKey) {
  const auto error = [](LlamaOptions o) {
    try {
      Llama model(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LlamaOptions o = odd_options();
  o.kv_heads = 4;
  EXPECT_THAT(error(o), HasSubstr("model.kv_heads (4) must divide model.heads (6)"));
  o = odd_options();
  o.head_dim = 0;
  o.heads = 5;
  o.kv_heads = 1;
  EXPECT_THAT(error(o), HasSubstr("model.heads (5) must divide model.d_model (48)"));
  o = odd_options();
  o.head_dim = 9;
  EXPECT_THAT(error(o), HasSubstr("must be even"));
  o = odd_options();
  o.rope.scaling = "llama3";
  o.rope.factor = 0.5;
  EXPECT_THAT(error(o), HasSubstr("model.rope_factor"));
}

}  // namespace TRAINER_UNITY_ID
