#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <stdexcept>

#include "models/mlp.h"
#include "models/recommender.h"

namespace models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(const ModelOptions&, const ModelShape&)>;

const std::map<std::string, Factory>& builtin() {
  static const std::map<std::string, Factory> models = {
      {"mlp", [](const ModelOptions& o, const ModelShape& s) {
         return std::make_shared<Mlp>(s.input_dim, o.hidden_dim, o.depth, s.num_classes);
       }},
      {"recommender", [](const ModelOptions& o, const ModelShape& s) {
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
       }},
  };
  return models;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : builtin()) names.push_back(name);
  return names;
}

bool has_model(const std::string& name) { return builtin().count(name) > 0; }

std::shared_ptr<Model> create_model(const ModelOptions& options, const ModelShape& shape) {
  auto it = builtin().find(options.name);
  if (it == builtin().end()) {
    throw std::invalid_argument(fmt::format("unknown model '{}'; known models: {}", options.name,
                                            fmt::join(model_names(), ", ")));
  }
  return it->second(options, shape);
}

}  // namespace models
