// Moved: text generation serves every language model (gpt and llama) and lives in
// models/lm/generate.h. This forwarding header stays only until src/train/text_samples.cpp
// includes the new path (the lead's src/train/ refactor); delete it then.
#pragma once

#include "models/lm/generate.h"
