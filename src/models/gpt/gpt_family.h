// The registry's gpt (model.name: gpt): the preset, the keys that override it, and
// model.init_from's weights (Hugging Face GPT-2 or a trainer checkpoint), as
// models::create_model builds it; --export-hf's GPT2LMHeadModel.
#pragma once

#include "models/lm/family.h"

namespace models {

LmFamily gpt_family();

}  // namespace models
