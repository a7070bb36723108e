// The odd-shaped llama the model tests share: vocabulary 61 (padded to 64, whose padded rows must
// stay out of the loss), 6 query heads over 2 kv heads, each 10 wide, in a 48-wide model (head_dim
// apart from d_model / heads), 2 blocks, MLP 72.
#pragma once

#include <cstdint>

#include "models/llama/llama_options.h"

namespace test {

inline models::LlamaOptions odd_llama_options(int64_t context, bool tied) {
  models::LlamaOptions o;
  o.vocab_size = 61;
  o.context = context;
  o.num_layers = 2;
  o.d_model = 48;
  o.heads = 6;
  o.kv_heads = 2;
  o.head_dim = 10;
  o.intermediate = 72;
  o.rms_norm_eps = 1e-5;
  o.rope.theta = 100.0;
  o.tie_embeddings = tied;
  return o;
}

}  // namespace test
