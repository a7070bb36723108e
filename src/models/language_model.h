// LanguageModel: what text generation (models/lm/generate.h: --generate, train.sample_every and
// --export-hf's callers) needs of a decoder, besides Model: its vocabulary, its context, and
// incremental decoding with a KV cache. gpt and llama implement it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "models/block.h"  // KvCache
#include "models/model.h"

namespace models {

class LanguageModel : public Model {
 public:
  // logits [n, t, padded vocabulary] of `tokens` [n, t] standing at positions cache.length() ..
  // cache.length() + t - 1, attending to the cached positions, which `cache` is then extended
  // by: the logits forward() gives for the whole sequence (up to rounding). Needs
  // cache.length() + t <= context(); no dropout (call it in eval mode).
  virtual at::Tensor forward_cached(const at::Tensor& tokens, KvCache& cache) = 0;
  // Ids the model predicts (the logits' columns past it are padding, never sampled).
  virtual int64_t vocab_size() const = 0;
  // Positions it can see.
  virtual int64_t context() const = 0;
};

}  // namespace models
