// What a serving stack reads beside exported weights, so that the directory --export-hf or
// --export-peft writes (launcher/generate_command.h) serves as it is: transformers'
// pipeline("text-generation", DIR), `vllm serve DIR` (and --lora-modules), llama.cpp's
// convert_hf_to_gguf.py (docs/guides/serve.md).
//
// - The run's tokenizer: the one --generate uses (data::tokenizer_setting: data.tokenizer; auto,
//   the tokenizer.json beside model.init_from). A tokenizer.json is copied, with the tokenizer
//   files beside it (kTokenizerFiles: tokenizer_config.json and its chat template, special tokens,
//   chat_template.jinja, ...) when it is named tokenizer.json; another name is copied as
//   tokenizer.json. The built-in encodings (bytes, gpt2) are written as a tokenizer.json of the
//   same ids (data::builtin_tokenizer_json). A data.tokenizer auto that cannot choose writes
//   none, and says why.
// - tokenizer_config.json, where none was copied: transformers' PreTrainedTokenizerFast with the
//   tokenizer's bos and eos tokens. The chat template a run was tokenized with through
//   --chat-template (its chat.json, data/chat_prompt.h) replaces the tokenizer's own in it.
// - generation_config.json (--export-hf): model.init_from's, or a new one, with bos_token_id and
//   eos_token_id; eos_token_id lists the ids that end an assistant's turn too (chat.json's
//   stop_ids), so that generation stops at the end of a reply.
// - config.json (--export-hf): bos_token_id and eos_token_id (model.init_from's config.json's,
//   else the tokenizer's), and dtype and torch_dtype set to the declared dtype.
//
// Files are written whole or not at all only as far as the file system makes a write so; an
// error names the file (std::runtime_error). Nothing here reads the weights.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace launcher {

struct ServingFiles {
  std::vector<std::string> written;  // the file names written into the directory, in order
  std::string tokenizer;             // where the tokenizer came from; "" when none was written
  std::string no_tokenizer;          // why not, when none was
};

// The tokenizer files, tokenizer_config.json and its chat template, into `dir`.
ServingFiles write_tokenizer_files(const config::Config& config, const std::string& dir);

// write_tokenizer_files, then generation_config.json and config.json's keys (above) for the
// weights --export-hf wrote into `dir`, declared as `dtype`.
ServingFiles write_serving_files(const config::Config& config, const std::string& dir,
                                 at::ScalarType dtype);

// The base as adapter_config.json's base_model_name_or_path records it, so that PEFT finds it from
// any directory: the Hub id in model.init_from's config.json (_name_or_path, when it reads as
// "owner/name" and no such directory is beside init_from or here), else init_from as an absolute
// path; "" without init_from.
std::string peft_base_name(const std::string& init_from);

}  // namespace launcher
