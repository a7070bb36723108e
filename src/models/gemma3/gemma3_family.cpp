// Gemma 3, text (transformers' Gemma3ForCausalLM, model_type gemma3_text): the Llama block with
// RMSNorms as x * (1 + weight), a norm before and after each of the attention and the MLP
// (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
// post_feedforward_layernorm), a GeGLU MLP (gelu_pytorch_tanh), q and k norms, the embedding
// scaled by sqrt(hidden_size), the attention scaled by query_pre_attn_scalar^-0.5, and layer_types
// alternating sliding-window layers (their own rope, theta 10,000) with full-attention layers
// (theta 1,000,000 and their own scaling). Soft-capping, bidirectional attention and the
// multimodal model (model_type gemma3, vision_config) are refused, naming the key.
#include "models/gemma3/gemma3_family.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "models/llama/llama_family.h"
#include "models/lm/hf_format.h"

namespace models {
namespace {

using nlohmann::json;

// The published models' config.json (google/gemma-3-1b-pt; gemma-3-4b-pt's text_config), and
// gemma3-tiny for tests and CPU runs (a window of 64 of its 256 positions on 5 of each 6 layers,
// a head_dim of 48 other than d_model / heads).
const std::vector<LlamaPreset> kGemma3Presets = {
    {"gemma3-tiny", 6, 256, 4, 2, 48, 512, 256, 256, 1000000.0, 0.0, true, 1e-6, 64},
    {"gemma-3-1b", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 1000000.0, 0.0, true, 1e-6, 512},
    {"gemma-3-4b", 34, 2560, 8, 4, 256, 10240, 262208, 131072, 1000000.0, 8.0, true, 1e-6, 1024,
     /*linear=*/true},
};

constexpr double kLocalTheta = 10000.0;     // Gemma3TextConfig's rope_local_base_freq
constexpr double kGlobalTheta = 1000000.0;  // and rope_theta
constexpr int64_t kPattern = 6;             // sliding_window_pattern: every 6th layer is global
constexpr int64_t kConfigWindow = 4096;     // Gemma3TextConfig's default sliding_window

// Layer i slides unless it is each pattern-th (Gemma3TextConfig without layer_types).
std::vector<bool> pattern_layers(int64_t layers, int64_t pattern) {
  std::vector<bool> sliding(static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; ++i) sliding[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  return sliding;
}

// rope_parameters by layer type (transformers 5), or rope_theta, rope_scaling and
// rope_local_base_freq (the older files).
void read_gemma3_rope(const HfConfig& r, LlamaOptions& o) {
  RopeOptions global, local;
  global.theta = r.number("rope_theta", kGlobalTheta);
  local.theta = r.number("rope_local_base_freq", kLocalTheta);
  if (const json* p = r.find("rope_parameters")) {
    if (p->is_object() && (p->contains("full_attention") || p->contains("sliding_attention"))) {
      const std::pair<const char*, RopeOptions*> types[] = {{"full_attention", &global},
                                                            {"sliding_attention", &local}};
      for (const auto& [type, rope] : types) {
        if (p->contains(type) && !p->at(type).is_null()) {
          read_rope_entry(r, fmt::format("rope_parameters.{}", type), p->at(type), *rope);
        }
      }
    } else {
      read_rope_entry(r, "rope_parameters", *p, global);
    }
  }
  if (const json* s = r.find("rope_scaling")) read_rope_entry(r, "rope_scaling", *s, global);
  o.rope = global;
  o.sliding_rope = local;
}

void read_gemma3(const HfConfig& r, LlamaOptions& o) {
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (r.find(key) != nullptr) throw r.bad(key, "soft-capping is not implemented (Gemma 2's)");
  }
  if (r.flag("use_bidirectional_attention", false)) {
    throw r.bad("use_bidirectional_attention", "gemma3 attends causally only");
  }
  o.attention_bias = r.flag("attention_bias", false);
  o.tie_embeddings = r.flag("tie_word_embeddings", true);  // Gemma3TextConfig's defaults
  o.head_dim = r.integer_or("head_dim", 256);
  o.context = r.integer_or("max_position_embeddings", 131072);
  o.query_pre_attn_scalar = r.number("query_pre_attn_scalar", 256.0);
  o.sliding_window =
      r.has("sliding_window") ? r.integer_or("sliding_window", 0) : kConfigWindow;  // null: none
  o.sliding_layers =
      r.find("layer_types") != nullptr
          ? read_layer_types(r, o.num_layers)
          : pattern_layers(o.num_layers, r.integer_or("sliding_window_pattern", kPattern));
  bool any = false;
  for (const bool s : o.sliding_layers) any = any || s;
  if (!any) o.sliding_window = 0;  // no layer slides: no window
}

void write_gemma3(const LlamaOptions& o, json& c) {
  c.erase("hidden_act");
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["rope_parameters"] = {{"full_attention", rope_entry_json(o.rope)},
                          {"sliding_attention", rope_entry_json(o.sliding_rope.value_or(o.rope))}};
  // An integer where it is one: Gemma3TextConfig's type (and every published model's).
  const double scalar = o.query_pre_attn_scalar;
  c["query_pre_attn_scalar"] =
      scalar == std::round(scalar) ? json(static_cast<int64_t>(scalar)) : json(scalar);
  // No sliding layer: the config's default, which no layer uses.
  c["sliding_window"] = o.sliding_window > 0 ? o.sliding_window : kConfigWindow;
  c["layer_types"] = layer_types_json(o);
  c["attention_bias"] = o.attention_bias;
  c["final_logit_softcapping"] = nullptr;
  c["attn_logit_softcapping"] = nullptr;
  c["use_bidirectional_attention"] = false;
  c["pad_token_id"] = nullptr;  // transformers would hold that row's gradient at zero
}

LlamaDialect make_gemma3_dialect() {
  LlamaDialect d;
  d.family = "gemma3";
  d.title = "Gemma 3";
  d.model_type = "gemma3_text";
  d.hf_class = "Gemma3ForCausalLM";
  d.activation = "gelu_pytorch_tanh";
  d.fix = [](LlamaOptions& o) {
    o.norm_offset = true;
    o.sandwich_norms = true;
    o.geglu = true;
    o.embed_scale = true;
    o.qk_norm = true;
    o.qkv_bias = false;
    o.mlp_bias = false;
    if (!o.sliding_rope) {
      o.sliding_rope = RopeOptions{};
      o.sliding_rope->theta = kLocalTheta;
    }
    if (o.query_pre_attn_scalar == 0) {
      o.query_pre_attn_scalar = static_cast<double>(o.resolved_head_dim());
    }
    if (o.sliding_layers.empty() && o.sliding_window > 0) {
      o.sliding_layers = pattern_layers(o.num_layers, kPattern);
    }
  };
  d.read_rope = read_gemma3_rope;
  d.read = read_gemma3;
  d.write = write_gemma3;
  return d;
}

}  // namespace

const LlamaDialect& gemma3_dialect() {
  static const LlamaDialect dialect = make_gemma3_dialect();
  return dialect;
}

LmFamily gemma3_family() { return llama_block_family(gemma3_dialect(), kGemma3Presets); }

}  // namespace models
