#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include "models/cnn.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf_gpt2.h"
#include "models/llama/llama_options.h"
#include "models/llama/make_llama.h"
#include "models/mlp.h"
#include "models/recommender.h"
#include "models/sequence.h"

namespace models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(const ModelOptions&, const core::Shape&)>;

// A key's value when set (> 0), else the fallback (a preset's, or the model's default).
int64_t or_else(int64_t value, int64_t fallback) { return value > 0 ? value : fallback; }

void require_data(bool ok, const std::string& model, const char* what) {
  if (!ok) {
    throw std::invalid_argument(
        fmt::format("model.name: {} needs {} (data.dataset gives none)", model, what));
  }
}

// Gpt(g), naming model.init_from's file when the dimensions it gave do not fit (Gpt names only
// the model keys).
std::shared_ptr<Gpt> build_gpt(const GptOptions& g, const std::optional<GptInit>& init) {
  try {
    return std::make_shared<Gpt>(g);
  } catch (const std::invalid_argument& e) {
    if (!init) throw;
    throw std::invalid_argument(fmt::format(
        "model.init_from: {}: {} (the file gives {} blocks, {} heads, {} wide, {} positions)",
        init->config_file.empty() ? init->file : init->config_file, e.what(), g.num_layers, g.heads,
        g.d_model, g.context));
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

std::shared_ptr<Model> make_gpt(const ModelOptions& o, const core::Shape& s) {
  require_data(s.vocab_size > 0 && s.context > 0, "gpt", "token data (data.dataset: tokens)");
  GptOptions g = gpt_preset(o.preset);  // the schema's default: gpt2
  g.vocab_size = s.vocab_size;
  g.padded_vocab_size = 0;  // rounded up to a multiple of 64
  g.num_layers = or_else(o.num_layers, g.num_layers);
  g.heads = or_else(o.heads, g.heads);
  g.d_model = or_else(o.d_model, g.d_model);
  g.context = or_else(o.context, s.context);
  std::optional<GptInit> init;
  if (!o.init_from.empty()) {
    // The file's dimensions win over the preset's; keys the config sets must agree.
    init = read_gpt_init(o.init_from);
    apply_init_dims(*init, {o.num_layers, o.heads, o.d_model, o.context, 0, 0}, g);
  }
  if (s.context > g.context) {
    throw std::invalid_argument(
        fmt::format("data.context = {} is longer than model.context = {} (the model's positions)",
                    s.context, g.context));
  }
  g.dropout = o.dropout;
  g.checkpoint_activations = o.checkpoint_activations;
  auto gpt = build_gpt(g, init);
  if (init) {
    load_gpt_init(*init, *gpt);
    spdlog::info("model.init_from: weights of {} {} ({} blocks, {} heads, {} wide, {} "
                 "positions)",
                 init->kind, init->file, g.num_layers, g.heads, g.d_model, g.context);
  }
  return gpt;
}

std::shared_ptr<Model> make_llama_model(const ModelOptions& o, const core::Shape& s) {
  return make_llama(o, s);
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

const std::map<std::string, Factory>& builtin() {
  static const std::map<std::string, Factory> models = {
      {"mlp", make_mlp},           {"recommender", make_recommender}, {"gpt", make_gpt},
      {"llama", make_llama_model}, {"sequence", make_sequence},       {"cnn", make_cnn},
  };
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
  for (auto& n : gpt_preset_names()) names.push_back(n);
  for (auto& n : llama_preset_names()) names.push_back(n);
  return names;
}

bool has_model(const std::string& name) { return builtin().count(name) > 0; }

std::shared_ptr<Model> create_model(const ModelOptions& options, const core::Shape& shape) {
  auto it = builtin().find(options.name);
  if (it == builtin().end()) {
    throw std::invalid_argument(fmt::format("unknown model '{}'; known models: {}", options.name,
                                            fmt::join(model_names(), ", ")));
  }
  return it->second(options, shape);
}

}  // namespace models
