// The registry's gemma3 (model.name: gemma3): Gemma 3's text model, a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// gemma3_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily gemma3_family();

struct LlamaDialect;  // models/llama/hf_llama.h
// How Gemma 3 spells config.json: what model.init_from's config.json is read with.
const LlamaDialect& gemma3_dialect();

}  // namespace models
