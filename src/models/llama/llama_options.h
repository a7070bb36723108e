// The dimensions and options of a Llama-style decoder (models/llama.h), its presets, and their
// checks: apart from the model so that the Hugging Face reader (models/hf_llama.h) and the
// registry can build and check them without the network.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/rope.h"

namespace models {

struct LlamaOptions {
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
  bool tie_embeddings = true;   // the output layer is the token embedding
  double dropout = 0.0;
  bool checkpoint_activations = false;
  int64_t loss_chunk_rows = 0;  // positions per chunk of the output layer (0: the default)

  int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : (heads > 0 ? d_model / heads : 0);
  }
};

// The presets' dimensions (no weights): llama-tiny (tests and CPU runs: 4 blocks, 256 wide, 8
// heads over 4 kv heads, MLP 688, vocab 256, 256 positions; 2.97M parameters), smollm-135m
// (SmolLM-135M: 30 blocks, 576 wide, 9 heads over 3, MLP 1536, vocab 49152, 2048 positions, tied)
// and llama-3.2-1b (16 blocks, 2048 wide, 32 heads over 8, MLP 8192, vocab 128256, theta 500000
// with llama3 scaling 32 over 8192 positions, tied). Throws std::invalid_argument naming
// model.preset for another name.
LlamaOptions llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();

// Throws std::invalid_argument ("llama: " + what is wrong, naming the model.* key) for options
// the model cannot be built with: a zero dimension, kv_heads not dividing heads, no head_dim and
// heads not dividing d_model, an odd head size, a bad rope or epsilon, padded_vocab_size below
// vocab_size. padded_vocab_size 0 is fine (resolved by the model).
void check_llama_options(const LlamaOptions& options);

}  // namespace models
