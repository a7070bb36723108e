// Mistral (transformers' MistralForCausalLM, model_type mistral): the Llama block without biases,
// with sliding-window attention on every layer when sliding_window is set (v0.1: 4096; v0.3:
// null, none). MistralConfig's default is 4096, so a config.json without the key slides too.
#include "models/mistral/mistral_family.h"

#include <nlohmann/json.hpp>

#include "models/llama/llama_family.h"
#include "models/lm/hf_format.h"

namespace models {
namespace {

// Mistral 7B v0.3's config.json, and mistral-tiny for tests and CPU runs (a window of 64 of its
// 256 positions, so that the window matters).
const std::vector<LlamaPreset> kMistralPresets = {
    {"mistral-tiny", 4, 256, 8, 2, 0, 640, 256, 256, 10000.0, 0.0, false, 1e-5, 64},
    {"mistral-7b-v0.3", 32, 4096, 32, 8, 0, 14336, 32768, 32768, 1000000.0, 0.0, false, 1e-5, 0},
};

constexpr int64_t kMistralConfigWindow = 4096;  // MistralConfig's default sliding_window

LlamaDialect make_mistral_dialect() {
  LlamaDialect d;
  d.family = "mistral";
  d.title = "Mistral";
  d.model_type = "mistral";
  d.hf_class = "MistralForCausalLM";
  d.fix = [](LlamaOptions& o) {
    o.attention_bias = false;
    o.mlp_bias = false;
    o.sliding_layers.clear();  // every layer
  };
  d.read = [](const HfConfig& r, LlamaOptions& o) {
    if (r.find("layer_types") != nullptr) {
      throw r.bad("layer_types", "mistral slides on every layer (Ministral's alternating layers "
                                 "are another model)");
    }
    // Absent: MistralConfig's default; null: none.
    o.sliding_window =
        r.has("sliding_window") ? r.integer_or("sliding_window", 0) : kMistralConfigWindow;
  };
  d.write = [](const LlamaOptions& o, nlohmann::json& c) {
    c["sliding_window"] =
        o.sliding_window > 0 ? nlohmann::json(o.sliding_window) : nlohmann::json(nullptr);
  };
  return d;
}

}  // namespace

const LlamaDialect& mistral_dialect() {
  static const LlamaDialect dialect = make_mistral_dialect();
  return dialect;
}

LmFamily mistral_family() { return llama_block_family(mistral_dialect(), kMistralPresets); }

}  // namespace models
