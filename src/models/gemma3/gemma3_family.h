// The registry's gemma3 (model.name: gemma3): Gemma 3's text model, a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// gemma3_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily gemma3_family();

}  // namespace models
