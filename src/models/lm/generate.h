// Text generation with a language model (gpt, llama: models/language_model.h): autoregressive
// sampling of new token ids after a prompt, with a KV cache (forward_cached: each new token
// runs through the model alone, attending to the cached keys and values of the positions before
// it).
//
// Contract: runs under no-grad in eval mode and puts the model's training mode back; draws its
// random numbers from a generator of its own, seeded from options.seed, so it never moves the
// default generators that training draws from, and the same seed gives the same ids. Logits of
// the padded vocabulary rows are never sampled. The sequence never grows past the model's
// context: generation stops when prompt + new ids fill it (no sliding window), and a prompt that
// fills it alone is std::invalid_argument.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "models/language_model.h"

namespace models {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (the most likely id every time)
  int64_t top_k = 0;         // sample among the k most likely ids (0: all)
  uint64_t seed = 0;
  std::optional<int64_t> stop_id;  // stop after generating it (the end-of-text id)
  std::vector<int64_t> stop_ids;   // ... or any of these (a chat template's end of turn)
  bool use_cache = true;           // false: recompute the whole sequence for every new id
};

// The new ids after `prompt` (ids below the model's vocab_size; at least one). Throws
// std::invalid_argument for an empty or too long prompt, an id out of range or bad options.
std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

// For callers that know a model only by the Model interface (train.sample_every's sampler,
// train/text_samples.h): the positions a model that generates text holds (prompt and new ids
// together), or 0 for a model that does not generate text (every model but gpt and llama).
int64_t generation_context(const Model& model);

// generate() on a model known by the Model interface. Throws std::invalid_argument for a model
// that does not generate text (generation_context() is 0), and what generate() throws.
std::vector<int64_t> generate(Model& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

}  // namespace models
