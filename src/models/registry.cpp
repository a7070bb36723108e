#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <utility>

#include "models/capabilities.h"
#include "models/cnn.h"
#include "models/gemma3/gemma3_family.h"
#include "models/gpt/gpt_family.h"
#include "models/llama/llama_family.h"
#include "models/lm/family.h"
#include "models/lm/lora.h"
#include "models/mistral/mistral_family.h"
#include "models/mlp.h"
#include "models/qwen2/qwen2_family.h"
#include "models/qwen3/qwen3_family.h"
#include "models/recommender.h"
#include "models/sequence.h"

namespace models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(const ModelOptions&, const core::Shape&)>;

void require_data(bool ok, const std::string& model, const char* what) {
  if (!ok) {
    throw std::invalid_argument(
        fmt::format("model.name: {} needs {} (data.dataset gives none)", model, what));
  }
}

std::shared_ptr<Model> make_mlp(const ModelOptions& o, const core::Shape& s) {
  return std::make_shared<Mlp>(s.input_dim, o.hidden_dim, o.depth, s.num_classes);
}

std::shared_ptr<Model> make_recommender(const ModelOptions& o, const core::Shape& s) {
  RecommenderOptions r;
  r.embedding_dim = o.embedding_dim;
  r.mlp_hidden = o.hidden_dim;
  r.mlp_depth = o.depth;
  r.encoder.dim = o.encoder_dim;
  r.encoder.layers = o.encoder_layers;
  r.encoder.heads = o.encoder_heads;
  const int64_t data_len = s.item_text.defined() ? s.item_text.size(1) : 0;
  r.encoder.max_len = o.text_len > 0 ? o.text_len : data_len;
  r.encoder.out_dim = o.embedding_dim;
  r.encoder_weights = o.encoder_weights;
  return std::make_shared<Recommender>(s.num_users, s.num_items, s.item_text, r);
}

std::shared_ptr<Model> make_sequence(const ModelOptions& o, const core::Shape& s) {
  require_data(s.window > 0 && s.features > 0, "sequence", "time-series data (data.dataset: csv)");
  SequenceOptions q;
  q.cell = o.cell;
  q.features = s.features;
  q.window = s.window;
  q.horizon = s.horizon;
  q.targets = s.targets;
  q.hidden_dim = o.hidden_dim;
  q.num_layers = o.num_layers;  // the schema's sequence defaults when not set
  q.d_model = o.d_model;
  q.heads = o.heads;
  q.dropout = o.dropout;
  return std::make_shared<SequenceForecaster>(q);
}

std::shared_ptr<Model> make_cnn(const ModelOptions& o, const core::Shape& s) {
  require_data(s.channels > 0, "cnn", "image data (data.dataset: images)");
  CnnOptions c;
  c.channels = s.channels;
  c.scale = s.scale;
  c.base_channels = o.base_channels;
  c.num_blocks = o.num_blocks;
  c.loss = o.loss;
  return std::make_shared<RestorationCnn>(c);
}

// The language models, in the order model.preset lists their presets.
const std::vector<LmFamily>& families() {
  static const std::vector<LmFamily> all = {gpt_family(),   llama_family(),   qwen2_family(),
                                            qwen3_family(), mistral_family(), gemma3_family()};
  return all;
}

const LmFamily* family(const std::string& name) {
  for (const LmFamily& f : families()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const std::map<std::string, Factory>& builtin() {
  static const std::map<std::string, Factory> models = [] {
    std::map<std::string, Factory> m = {{"mlp", make_mlp},
                                        {"recommender", make_recommender},
                                        {"sequence", make_sequence},
                                        {"cnn", make_cnn}};
    for (const LmFamily& f : families()) {
      m.emplace(f.name, [make = f.make](const ModelOptions& o, const core::Shape& s) {
        std::shared_ptr<CausalLm> lm = make(o, s);
        require_context_fits(s, lm->context());  // the data's windows: training reads them
        return std::shared_ptr<Model>(with_lora(std::move(lm), o));
      });
    }
    return m;
  }();
  return models;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : builtin()) names.push_back(name);
  return names;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const LmFamily& f : families())
    names.insert(names.end(), f.presets.begin(), f.presets.end());
  return names;
}

std::vector<std::pair<std::string, std::string>> default_presets() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const LmFamily& f : families()) {
    if (&f != &families().front() && !f.presets.empty())
      out.emplace_back(f.name, f.presets.front());
  }
  return out;
}

std::vector<std::string> language_model_names() {
  std::vector<std::string> names;
  for (const LmFamily& f : families()) names.push_back(f.name);
  return names;
}

bool builds_without_storage(const std::string& name) {
  const auto lms = language_model_names();
  return std::find(lms.begin(), lms.end(), name) != lms.end();
}

bool builds_without_storage(const Model& model) { return as<ParameterUnits>(model) != nullptr; }

bool has_model(const std::string& name) { return builtin().count(name) > 0; }

std::shared_ptr<Model> create_model(const ModelOptions& options, const core::Shape& shape) {
  auto it = builtin().find(options.name);
  if (options.has_adapters() && family(options.name) == nullptr) {
    throw std::invalid_argument(
        fmt::format("model.lora_rank: LoRA adapts the language models ({}); model.name is {}",
                    fmt::join(language_model_names(), ", "), options.name));
  }
  if (it == builtin().end()) {
    throw std::invalid_argument(fmt::format("unknown model '{}'; known models: {}", options.name,
                                            fmt::join(model_names(), ", ")));
  }
  return it->second(options, shape);
}

std::shared_ptr<LanguageModel> create_language_model(const ModelOptions& options,
                                                     const core::Shape& shape,
                                                     const std::string& command) {
  const LmFamily* f = family(options.name);
  if (f == nullptr) {
    throw std::invalid_argument(
        fmt::format("{} needs a language model (model.name: {}); this config has model.name: {}",
                    command, fmt::join(language_model_names(), ", "), options.name));
  }
  return with_lora(f->make(options, shape), options);
}

HfExport export_hf(const std::string& name, Model& model, const std::string& dir,
                   int64_t max_shard_bytes, const ParameterReader& read, at::ScalarType dtype) {
  const LmFamily* f = family(name);
  if (f == nullptr) {
    throw std::invalid_argument(fmt::format("model.name: {} has no Hugging Face format", name));
  }
  return {f->export_hf(model, dir, max_shard_bytes, read, dtype), f->hf_class};
}

}  // namespace models
