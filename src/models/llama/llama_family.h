// llama's entry of the model registry (models/registry.cpp), and the one mechanism its kin share:
// a family of the Llama block (models/llama/llama.h) is its model.name, its presets and its
// dialect of Hugging Face's config.json (models/llama/hf_llama.h). Qwen2 (models/qwen2/), Qwen3
// (models/qwen3/), Mistral (models/mistral/) and Gemma 3 (models/gemma3/) are such families: each
// folder holds its presets and its dialect, and builds its LmFamily here.
#pragma once

#include <vector>

#include "models/llama/hf_llama.h"
#include "models/llama/llama_options.h"
#include "models/lm/family.h"

namespace models {

LmFamily llama_family();

// The LmFamily of a kin of the Llama block: model.name dialect.family, its presets (the first is
// model.preset's default for it), model.init_from and --export-hf through the dialect.
LmFamily llama_block_family(const LlamaDialect& dialect, std::vector<LlamaPreset> presets);

}  // namespace models
