// The model zoo, by name. Every built-in model is listed in registry.cpp; the language models
// (gpt, llama) as families (models/lm/family.h), which also say how --export-hf writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "models/deferred_init.h"
#include "models/language_model.h"
#include "models/model.h"

namespace models {

std::vector<std::string> model_names();
bool has_model(const std::string& name);
// model.preset's choices: each language-model family's presets, in the registry's order.
std::vector<std::string> preset_names();
// model.preset's default for each family but the first (gpt: the schema's default, gpt2): its
// first preset, as (model.name, preset).
std::vector<std::pair<std::string, std::string>> default_presets();
// The model `options` names, sized for the data `shape` describes (data::Dataset::shape()).
// Throws std::invalid_argument naming the known models when `options.name` is unknown, naming
// the data it needs when `shape` lacks it, and naming data.context and model.context when a
// language model sees fewer positions than the data's windows hold.
std::shared_ptr<Model> create_model(const ModelOptions& options, const core::Shape& shape);

// The model names that are language models (gpt, llama): what --generate, --export-hf and
// eval.tasks take.
std::vector<std::string> language_model_names();
// The one rule for the deferred build: a training run under ddp.shard: parameters builds these
// models without storage (models/deferred_init.h), each rank filling only its blocks: the
// language models, whose models declare their units (ParameterUnits). Asked by name before the
// build (launcher/startup.cpp), and of a built model by the memory plan's what-if under
// parameters (train/memory_planner.cpp); a unit test checks that the two agree for every model.
bool builds_without_storage(const std::string& name);
bool builds_without_storage(const Model& model);
// create_model for a command that needs a language model and reads no data (`command`:
// "--generate", "--export-hf", ...): `shape.context` is only the positions' fallback (no
// model.context, no model.init_from), so a data.context longer than the model's positions is not
// an error here, as it is for create_model. std::invalid_argument "COMMAND needs a language model
// (model.name: gpt or llama); this config has model.name: NAME" for another model, else what
// create_model throws.
std::shared_ptr<LanguageModel> create_language_model(const ModelOptions& options,
                                                     const core::Shape& shape,
                                                     const std::string& command);

// What --export-hf wrote: the weight files (the index last) and transformers' class that loads
// them.
struct HfExport {
  std::vector<std::string> files;
  std::string hf_class;
};
// Writes `model`, which create_model built for model.name `name`, into `dir` as Hugging Face's
// save_pretrained does (config.json and the weights in `dtype`, sharded above max_shard_bytes),
// through its family's exporter, one tensor at a time: the parameters' values from `read` (a
// checkpoint read by ranges, for a model built without storage), or the model's own when empty.
// std::invalid_argument for a model without one; std::runtime_error naming a file that cannot be
// written.
HfExport export_hf(const std::string& name, Model& model, const std::string& dir,
                   int64_t max_shard_bytes, const ParameterReader& read = {},
                   at::ScalarType dtype = at::kFloat);

}  // namespace models
