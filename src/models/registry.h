// The model zoo, by name. Every built-in model is listed in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/shape.h"
#include "models/model.h"

namespace models {

std::vector<std::string> model_names();
bool has_model(const std::string& name);
// model.preset's choices: gpt's presets, then llama's.
std::vector<std::string> preset_names();
// The model `options` names, sized for the data `shape` describes (data::Dataset::shape()).
// Throws std::invalid_argument naming the known models when `options.name` is unknown, and naming
// the data it needs when `shape` lacks it.
std::shared_ptr<Model> create_model(const ModelOptions& options, const core::Shape& shape);

}  // namespace models
