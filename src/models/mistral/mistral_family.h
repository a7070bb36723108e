// The registry's mistral (model.name: mistral): a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// mistral_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily mistral_family();

}  // namespace models
