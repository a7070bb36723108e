// The language-model commands beside training.
//
//   trainer --config C --generate "PROMPT" [--max-new-tokens N] [--temperature T] [--top-k K]
//           [--seed S]      writes PROMPT and its continuation to stdout
//   trainer --config C --generate --chat "QUESTION" [the options above]
//                           writes the model's reply to QUESTION as a user's turn, rendered with
//                           the chat template the shards were made with: the chat.json
//                           (data/chat_prompt.h) in data.path's folder, else beside
//                           model.init_from's weights; sampling stops at the template's end of
//                           turn (not written)
//   trainer --config C --export-hf DIR
//           [--max-shard-size 5GB]
//                           writes DIR/config.json and DIR/model.safetensors (in shards above the
//                           size), found through the model registry (models::export_hf: the
//                           family's exporter, models/gpt/hf_gpt2.h, models/llama/hf_llama.h);
//                           with LoRA adapters (model.lora_rank), merged: W + scale B A
//   trainer --config C --export-peft DIR
//                           writes the adapters of a LoRA run as PEFT does (DIR/
//                           adapter_config.json, DIR/adapter_model.safetensors)
//
// Both run in one process, without MPI (under mpirun, rank 0 works and the others exit 0), on
// the weights the config names, in this order: the checkpoint file checkpoint.resume names; the
// newest checkpoint in checkpoint.dir that verifies (whatever checkpoint.resume says); the
// weights of model.init_from (launcher/resume.h, ResumeFor::kWeights). With none of them,
// --generate samples from the untrained model (saying so) and --export-hf refuses. The model is
// built as training builds it, from the config (data.vocab_size, data.context for its shape; no
// data is read), under the config's memory limits (memory.cpu_budget_mb, memory.fraction).
// Errors end the command through the start-up table of launcher/exit_status.h: a user mistake (a
// model that is not a language model, a checkpoint that does not fit, no weights to export, a bad
// option) exits 2 and out of memory 4, each with its message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"

namespace launcher {

struct GenerateArgs {
  std::string prompt;
  std::optional<std::string> chat;  // --chat QUESTION: a user's turn instead of a prompt
  int64_t max_new_tokens = 256;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 200;       // 0: every id
  uint64_t seed = 1337;
};

// The exit codes of the two commands (launcher/exit_codes.h).
int run_generate(const std::string& config_path, const std::vector<std::string>& overrides,
                 const GenerateArgs& args);
// --export-hf's options.
struct ExportHfArgs {
  std::string max_shard_size = "5GB";  // --max-shard-size
  std::string dtype;                   // --export-dtype bf16|fp16|fp32; "": train.precision's
  bool force = false;                  // --force: DIR may exist and hold files
};
// --consolidate, --export-hf and --export-peft write nothing over what exists (a file, or a
// directory that is not empty: a user would miss it) unless --force: exit 2 naming it.
int run_export_hf(const std::string& config_path, const std::vector<std::string>& overrides,
                  const std::string& dir, const ExportHfArgs& args = {});
// --export-peft DIR: the adapters of a LoRA run's checkpoint as PEFT writes them (DIR/
// adapter_config.json, DIR/adapter_model.safetensors; models/lm/lora.h).
int run_export_peft(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& dir, bool force = false);
// --consolidate DIR: a sharded checkpoint's step directory (checkpoint/sharded.h), every
// file verified, written as the single-file format to DIR.safetensors.
int run_consolidate(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& step_dir, bool force = false);

}  // namespace launcher
