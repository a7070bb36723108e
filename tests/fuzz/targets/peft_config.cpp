// A PEFT adapter_config.json through check_peft_config, load_peft's reading and checking of it
// (model.lora_init_from), against a model's LoRA options (the first byte picks the rank, alpha,
// rsLoRA and targets). Typed error: std::invalid_argument ("model.lora_init_from: FILE: ...").
#include <stdexcept>

#include "fuzz_target.h"
#include "models/lm/lora.h"

TRAINER_FUZZ_TARGET(peft_config) {
  if (size == 0) return 0;
  const std::string file =
      fuzz::write_file("peft_config/adapter_config.json", fuzz::as_text(data + 1, size - 1));
  models::LoraOptions options;
  options.rank = 1 + (data[0] & 15);
  options.alpha = 8.0 * (1 + ((data[0] >> 4) & 1));
  options.rslora = (data[0] & 32) != 0;
  options.targets = (data[0] & 64) != 0 ? std::vector<std::string>{"c_attn"}
                                        : std::vector<std::string>{"q_proj", "v_proj"};
  try {
    models::check_peft_config(options, file);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
