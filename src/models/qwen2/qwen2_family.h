// The registry's qwen2 (model.name: qwen2): a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// qwen2_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily qwen2_family();

struct LlamaDialect;  // models/llama/hf_llama.h
// How Qwen2 spells config.json: what model.init_from's config.json is read with.
const LlamaDialect& qwen2_dialect();

}  // namespace models
