// The registry's llama (model.name: llama): the preset, the keys that override it, and
// model.init_from's Hugging Face weights, as models::create_model builds it; --export-hf's
// LlamaForCausalLM.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily llama_family();

}  // namespace models
