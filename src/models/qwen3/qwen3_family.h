// The registry's qwen3 (model.name: qwen3): a family of the Llama block
// (models/llama/llama_family.h); its presets and its dialect of Hugging Face's config.json are in
// qwen3_family.cpp.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily qwen3_family();

struct LlamaDialect;  // models/llama/hf_llama.h
// How Qwen3 spells config.json: what model.init_from's config.json is read with.
const LlamaDialect& qwen3_dialect();

}  // namespace models
