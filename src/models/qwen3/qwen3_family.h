// The registry's qwen3 (model.name: qwen3): a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// qwen3_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily qwen3_family();

}  // namespace models
