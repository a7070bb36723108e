// The model zoo, by name. Every built-in model is listed in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace models {

std::vector<std::string> model_names();
bool has_model(const std::string& name);
// Throws std::invalid_argument naming the known models when `options.name` is unknown.
std::shared_ptr<Model> create_model(const ModelOptions& options, const ModelShape& shape);

}  // namespace models
