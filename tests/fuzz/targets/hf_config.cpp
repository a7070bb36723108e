// A Hugging Face config.json through the reader of model.init_from for each language-model
// family (the first byte picks one): read_gpt2_config (gpt), read_llama_config with the llama,
// qwen2, qwen3, mistral or gemma3 dialect. Typed error: std::invalid_argument
// ("model.init_from: FILE: KEY ...").
#include <stdexcept>

#include "fuzz_target.h"
#include "models/gemma3/gemma3_family.h"
#include "models/gpt/hf_gpt2.h"
#include "models/llama/hf_llama.h"
#include "models/mistral/mistral_family.h"
#include "models/qwen2/qwen2_family.h"
#include "models/qwen3/qwen3_family.h"

TRAINER_FUZZ_TARGET(hf_config) {
  if (size == 0) return 0;
  const std::string file =
      fuzz::write_file("hf_config/config.json", fuzz::as_text(data + 1, size - 1));
  const models::LlamaDialect* dialects[] = {&models::llama_dialect(), &models::qwen2_dialect(),
                                            &models::qwen3_dialect(), &models::mistral_dialect(),
                                            &models::gemma3_dialect()};
  try {
    const size_t family = data[0] % 6;
    if (family == 5) {
      models::Gpt2Dims dims;
      models::read_gpt2_config(file, dims);
    } else {
      models::read_llama_config(file, *dialects[family]);
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
