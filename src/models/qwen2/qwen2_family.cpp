// Qwen2 and Qwen2.5 (transformers' Qwen2ForCausalLM, model_type qwen2): the Llama block with
// biases on q_proj, k_proj and v_proj (none on o_proj or the MLP), and sliding-window attention on
// the layers layer_types names when use_sliding_window is set.
#include "models/qwen2/qwen2_family.h"

#include "models/llama/llama_family.h"

namespace models {
namespace {

// The published models' config.json (Qwen2.5-7B's vocabulary is 152064 rows), and qwen2-tiny for
// tests and CPU runs.
const std::vector<LlamaPreset> kQwen2Presets = {
    {"qwen2-tiny", 4, 256, 8, 2, 0, 640, 256, 256, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen2.5-0.5b", 24, 896, 14, 2, 0, 4864, 151936, 32768, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen2.5-1.5b", 28, 1536, 12, 2, 0, 8960, 151936, 32768, 1000000.0, 0.0, true, 1e-6, 0},
    {"qwen2.5-7b", 28, 3584, 28, 4, 0, 18944, 152064, 131072, 1000000.0, 0.0, false, 1e-6, 0},
};

LlamaDialect make_qwen2_dialect() {
  LlamaDialect d;
  d.family = "qwen2";
  d.title = "Qwen2";
  d.model_type = "qwen2";
  d.hf_class = "Qwen2ForCausalLM";
  d.fix = [](LlamaOptions& o) {
    o.qkv_bias = true;
    o.attention_bias = false;
    o.mlp_bias = false;
  };
  d.read = read_layer_windows;
  d.write = write_layer_windows;
  return d;
}

}  // namespace

const LlamaDialect& qwen2_dialect() {
  static const LlamaDialect dialect = make_qwen2_dialect();
  return dialect;
}

LmFamily qwen2_family() { return llama_block_family(qwen2_dialect(), kQwen2Presets); }

}  // namespace models
