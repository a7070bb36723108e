// The registry's llama (model.name: llama): the preset, the keys that override it, and
// model.init_from's Hugging Face weights, as models::create_model builds it.
#pragma once

#include <memory>

#include "core/shape.h"
#include "models/llama/llama.h"
#include "models/model.h"

namespace models {

// Throws std::invalid_argument naming the key (or model.init_from's file) for what does not fit.
std::shared_ptr<Llama> make_llama(const ModelOptions& options, const core::Shape& shape);

}  // namespace models
