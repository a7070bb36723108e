// The registry's mistral (model.name: mistral): a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// mistral_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily mistral_family();

struct LlamaDialect;  // models/llama/hf_llama.h
// How Mistral spells config.json: what model.init_from's config.json is read with.
const LlamaDialect& mistral_dialect();

}  // namespace models
