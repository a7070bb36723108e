#include "models/llama/llama_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "models/lm/presets.h"

namespace models {
namespace {

// Llama 3.1's and 3.2's eps is 1e-5, SmolLM's too.
const std::vector<LlamaPreset> kLlamaPresets = {
    {"llama-tiny", 4, 256, 8, 4, 0, 688, 256, 256, 10000.0, 0.0, true, 1e-5, 0},
    {"smollm-135m", 30, 576, 9, 3, 0, 1536, 49152, 2048, 10000.0, 0.0, true, 1e-5, 0},
    {"llama-3.2-1b", 16, 2048, 32, 8, 0, 8192, 128256, 131072, 500000.0, 32.0, true, 1e-5, 0},
    {"llama-3.1-8b", 32, 4096, 32, 8, 0, 14336, 128256, 131072, 500000.0, 8.0, false, 1e-5, 0},
    {"llama-3.1-70b", 80, 8192, 64, 8, 0, 28672, 128256, 131072, 500000.0, 8.0, false, 1e-5, 0},
};

void require_family(bool ok, const std::string& family, const std::string& message) {
  if (!ok) throw std::invalid_argument(family + ": " + message);
}

}  // namespace

LlamaOptions options_of(const LlamaPreset& p, const std::string& family) {
  LlamaOptions o;
  o.family = family;
  o.num_layers = p.num_layers;
  o.d_model = p.d_model;
  o.heads = p.heads;
  o.kv_heads = p.kv_heads;
  o.head_dim = p.head_dim;
  o.intermediate = p.intermediate;
  o.vocab_size = p.vocab_size;
  o.context = p.context;
  o.rope.theta = p.rope_theta;
  o.tie_embeddings = p.tied;
  o.rms_norm_eps = p.rms_norm_eps;
  o.sliding_window = p.sliding_window;
  if (p.llama3_factor > 0 && p.linear) {
    o.rope.scaling = "linear";
    o.rope.factor = p.llama3_factor;
  } else if (p.llama3_factor > 0) {  // Llama 3.1's and 3.2's config.json
    o.rope.scaling = "llama3";
    o.rope.factor = p.llama3_factor;
    o.rope.low_freq_factor = 1.0;
    o.rope.high_freq_factor = 4.0;
    o.rope.original_context = 8192;
  }
  return o;
}

LlamaOptions llama_preset(const std::string& name) {
  return options_of(find_preset(kLlamaPresets, name, "llama"), "llama");
}

std::vector<std::string> llama_preset_names() { return preset_names_of(kLlamaPresets); }

const std::vector<LlamaPreset>& llama_presets() { return kLlamaPresets; }

void check_llama_options(const LlamaOptions& o) {
  const auto require_llama = [&](bool ok, const std::string& message) {
    require_family(ok, o.family, message);
  };
  const std::pair<const char*, int64_t> positive[] = {
      {"model.num_layers", o.num_layers}, {"model.d_model", o.d_model},
      {"model.heads", o.heads},           {"model.intermediate_size", o.intermediate},
      {"model.context", o.context},       {"data.vocab_size", o.vocab_size}};
  for (const auto& [key, value] : positive) {
    require_llama(value > 0, fmt::format("{} must be positive, got {}", key, value));
  }
  require_llama(o.kv_heads >= 0 && o.head_dim >= 0,
                fmt::format("model.kv_heads ({}) and model.head_dim ({}) must not be negative",
                            o.kv_heads, o.head_dim));
  require_llama(
      o.heads % o.resolved_kv_heads() == 0,
      fmt::format("model.kv_heads ({}) must divide model.heads ({})", o.kv_heads, o.heads));
  require_llama(
      o.head_dim > 0 || o.d_model % o.heads == 0,
      fmt::format("model.heads ({}) must divide model.d_model ({}) when model.head_dim is not "
                  "set",
                  o.heads, o.d_model));
  require_llama(o.resolved_head_dim() % 2 == 0,
                fmt::format("the head size ({}) must be even for the rotary embedding",
                            o.resolved_head_dim()));
  require_llama(o.rms_norm_eps > 0.0,
                fmt::format("model.rms_norm_eps must be positive, got {}", o.rms_norm_eps));
  require_llama(o.dropout >= 0.0 && o.dropout < 1.0,
                fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));
  require_llama(o.padded_vocab_size == 0 || o.padded_vocab_size >= o.vocab_size,
                fmt::format("padded_vocab_size ({}) must be at least data.vocab_size ({})",
                            o.padded_vocab_size, o.vocab_size));
  require_llama(o.sliding_window >= 0,
                fmt::format("model.sliding_window must not be negative, got {}", o.sliding_window));
  require_llama(
      o.sliding_layers.empty() || static_cast<int64_t>(o.sliding_layers.size()) == o.num_layers,
      fmt::format("{} layer types for {} layers", o.sliding_layers.size(), o.num_layers));
  require_llama(
      o.query_pre_attn_scalar >= 0.0,
      fmt::format("query_pre_attn_scalar must not be negative, got {}", o.query_pre_attn_scalar));
  try {
    check_rope_options(o.rope);
    if (o.sliding_rope) check_rope_options(*o.sliding_rope, "model.sliding_");
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(o.family + ": " + e.what());
  }
}

}  // namespace models
