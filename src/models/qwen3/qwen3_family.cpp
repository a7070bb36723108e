// Qwen3, dense (transformers' Qwen3ForCausalLM, model_type qwen3): the Llama block with an RMSNorm
// over each head of q and k before the rotary embedding (q_norm, k_norm), an explicit head_dim,
// biases on the attention only with attention_bias, and sliding-window attention on the layers
// layer_types names when use_sliding_window is set.
#include "models/qwen3/qwen3_family.h"

#include <nlohmann/json.hpp>

#include "models/llama/llama_family.h"
#include "models/lm/hf_format.h"

namespace models {
namespace {

// The published models' config.json (tied embeddings up to 4B), and qwen3-tiny for tests and CPU
// runs: a head_dim (48) other than d_model / heads, as the real ones (128 at 1024 / 16).
const std::vector<LlamaPreset> kQwen3Presets = {
    {"qwen3-tiny", 4, 256, 8, 4, 48, 512, 256, 256, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, 40960, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, 40960, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1000000.0, 0.0, false, 1e-6, 0},
    {"qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, 40960, 1000000.0, 0.0, false, 1e-6, 0},
};

LlamaDialect make_qwen3_dialect() {
  LlamaDialect d;
  d.family = "qwen3";
  d.title = "Qwen3";
  d.model_type = "qwen3";
  d.hf_class = "Qwen3ForCausalLM";
  d.fix = [](LlamaOptions& o) {
    o.qk_norm = true;
    o.qkv_bias = false;
    o.mlp_bias = false;
  };
  d.read = [](const HfConfig& r, LlamaOptions& o) {
    o.attention_bias = r.flag("attention_bias", false);
    read_layer_windows(r, o);
  };
  d.write = [](const LlamaOptions& o, nlohmann::json& c) {
    c["attention_bias"] = o.attention_bias;
    write_layer_windows(o, c);
  };
  return d;
}

}  // namespace

const LlamaDialect& qwen3_dialect() {
  static const LlamaDialect dialect = make_qwen3_dialect();
  return dialect;
}

LmFamily qwen3_family() { return llama_block_family(qwen3_dialect(), kQwen3Presets); }

}  // namespace models
