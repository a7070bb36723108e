// A language-model family (gpt: models/gpt/gpt_family.h, llama: models/llama/llama_family.h) as
// the model registry lists it (models/registry.h): its model.name, its presets, how it is built
// from the config, and how --export-hf writes it. With the steps every family's factory shares:
// the token-data and context checks, the keys that override a preset.
#pragma once

#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/shape.h"
#include "models/deferred_init.h"
#include "models/lm/causal_lm.h"
#include "models/model.h"

namespace models {

struct LmFamily {
  std::string name;                  // model.name
  std::vector<std::string> presets;  // model.preset's choices for it
  // The model `options` names (the preset, the keys over it, model.init_from's weights), sized
  // for the token data `shape` describes (its context: the positions when neither model.context
  // nor model.init_from gives them; whether the data's windows fit is the registry's check,
  // require_context_fits, which only create_model makes). Throws std::invalid_argument naming
  // the key or file.
  std::function<std::shared_ptr<CausalLm>(const ModelOptions& options, const core::Shape& shape)>
      make;
  // transformers' class that loads an export ("GPT2LMHeadModel"), for the message.
  std::string hf_class;
  // Writes `model` (which `make` built) into `dir` as save_pretrained does (config.json and the
  // weights in `dtype`, sharded above max_shard_bytes), one tensor at a time from `read` (the
  // model's own parameters when empty: models/lm/hf_ranges.h, write_hf_streaming); returns the
  // weight files (the index last). Throws std::runtime_error naming a file that cannot be written.
  std::function<std::vector<std::string>(Model& model, const std::string& dir,
                                         int64_t max_shard_bytes, const ParameterReader& read,
                                         at::ScalarType dtype)>
      export_hf;
};

// A key's value when set (> 0), else the fallback (the preset's, or the file's).
inline int64_t or_else(int64_t value, int64_t fallback) { return value > 0 ? value : fallback; }
inline double or_else(double value, double fallback) { return value > 0.0 ? value : fallback; }

// std::invalid_argument naming model.name unless `shape` describes token data.
void require_token_data(const core::Shape& shape, const std::string& family);
// std::invalid_argument naming both keys when the data's windows are longer than the model sees.
void require_context_fits(const core::Shape& shape, int64_t model_context);

// `model` as the family's type, for the family's own functions (export_hf): a model another
// family built is std::invalid_argument naming both.
template <class Family>
Family& as_family(Model& model, const std::string& family) {
  auto* m = dynamic_cast<Family*>(&model);
  if (m == nullptr) {
    throw std::invalid_argument(fmt::format("the model is not a {} (model.name)", family));
  }
  return *m;
}

}  // namespace models
