#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <stdexcept>

#include "models/mlp.h"

namespace models {
namespace {

using Factory = std::function<std::shared_ptr<Model>(const ModelOptions&, const ModelShape&)>;

const std::map<std::string, Factory>& builtin() {
  static const std::map<std::string, Factory> models = {
      {"mlp", [](const ModelOptions& o, const ModelShape& s) {
         return std::make_shared<Mlp>(s.input_dim, o.hidden_dim, o.depth, s.num_classes);
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
