// The dimensions and options of a Llama-style decoder (models/llama.h), its presets, and their
// checks: apart from the model so that the Hugging Face reader (models/hf_llama.h) and the
// registry can build and check them without the network.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/rope.h"

namespace models {

struct LlamaOptions {
  std::string family = "llama";   // model.name: llama or a kin of its block (qwen2, qwen3,
                                  // mistral: models/llama/llama_family.h); its errors' prefix
  int64_t vocab_size = 0;         // token ids the data holds (targets are below it)
  int64_t padded_vocab_size = 0;  // rows of the embedding and output layer (0: vocab_size
                                  // rounded up to a multiple of 64)
  int64_t context = 0;            // positions the model may see (no weight depends on it)
  int64_t num_layers = 0;
  int64_t d_model = 0;       // hidden_size
  int64_t heads = 0;         // query heads
  int64_t kv_heads = 0;      // key/value heads, dividing heads (0: heads)
  int64_t head_dim = 0;      // per head (0: d_model / heads, which heads must then divide)
  int64_t intermediate = 0;  // the SwiGLU MLP's hidden size
  double rms_norm_eps = 1e-5;
  RopeOptions rope;
  bool attention_bias = false;  // biases on q_proj, k_proj, v_proj, o_proj
  bool mlp_bias = false;        // biases on gate_proj, up_proj, down_proj
  bool qkv_bias = false;        // biases on q_proj, k_proj, v_proj alone (Qwen2)
  bool qk_norm = false;         // RMSNorm over each head of q and k: q_norm, k_norm (Qwen3)
  int64_t sliding_window = 0;   // sliding-window attention's reach in positions (0: none)
  // The layers the window applies to (Hugging Face's layer_types: true for "sliding_attention");
  // empty: every layer, when sliding_window is set.
  std::vector<bool> sliding_layers;
  // Gemma 3 (models/gemma3/): RMSNorms as x * (1 + weight) with weights from zero; a norm after
  // the attention and after the MLP too (sandwich); a GeGLU MLP (tanh GELU); the embedding times
  // sqrt(d_model); the attention scaled by query_pre_attn_scalar^-0.5 (0: head_dim's); the
  // sliding layers' own rotary frequencies (none: `rope`'s on every layer).
  bool norm_offset = false;
  bool sandwich_norms = false;
  bool geglu = false;
  bool embed_scale = false;
  double query_pre_attn_scalar = 0.0;
  std::optional<RopeOptions> sliding_rope;
  bool tie_embeddings = true;  // the output layer is the token embedding
  double dropout = 0.0;
  bool checkpoint_activations = false;
  int64_t loss_chunk_rows = 0;  // positions per chunk of the output layer (0: the default)

  int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : (heads > 0 ? d_model / heads : 0);
  }
  // Layer i's window (0: none).
  int64_t window_of(int64_t layer) const {
    const bool slides =
        sliding_layers.empty() || (layer < static_cast<int64_t>(sliding_layers.size()) &&
                                   sliding_layers[static_cast<size_t>(layer)]);
    return slides ? sliding_window : 0;
  }
};

// A published model's shape (its config.json), dimensions only: no weights come with a preset
// (model.init_from brings them). The presets of llama and of its kin (each family's folder keeps
// its table); what a family's architecture fixes (Qwen2's biases, Qwen3's norms) its factory sets.
struct LlamaPreset {
  const char* name;
  int64_t num_layers, d_model, heads, kv_heads, head_dim, intermediate, vocab_size, context;
  double rope_theta;
  double llama3_factor;  // rope scaling "llama3" (or `linear`) with this factor (0: none)
  bool tied;             // tie_word_embeddings
  double rms_norm_eps;
  int64_t sliding_window;  // every layer's (0: none)
  bool linear = false;     // the factor scales every frequency (Gemma 3's), not llama3's way
};
LlamaOptions options_of(const LlamaPreset& preset, const std::string& family);

// llama's presets: llama-tiny (tests and CPU runs: 4 blocks, 256 wide, 8 heads over 4 kv heads,
// MLP 688, vocab 256, 256 positions; 2.97M parameters), smollm-135m (SmolLM-135M: 30 blocks, 576
// wide, 9 heads over 3, MLP 1536, vocab 49152, 2048 positions, tied), llama-3.2-1b (16 blocks,
// 2048 wide, 32 heads over 8, MLP 8192, vocab 128256, theta 500000 with llama3 scaling 32 over
// 8192 positions, tied), llama-3.1-8b and llama-3.1-70b (untied, scaling 8). Throws
// std::invalid_argument naming model.preset for another name.
LlamaOptions llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();
const std::vector<LlamaPreset>& llama_presets();

// Throws std::invalid_argument (family + ": " + what is wrong, naming the model.* key) for
// options the model cannot be built with: a zero dimension, kv_heads not dividing heads, no
// head_dim and heads not dividing d_model, an odd head size, a bad rope or epsilon,
// padded_vocab_size below vocab_size, a negative window or a layer list of another length.
// padded_vocab_size 0 is fine (resolved by the model).
void check_llama_options(const LlamaOptions& options);

}  // namespace models
