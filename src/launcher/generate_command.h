// The language-model commands beside training, and the text samples logged while training.
//
//   trainer --config C --generate "PROMPT" [--max-new-tokens N] [--temperature T] [--top-k K]
//           [--seed S]      writes PROMPT and its continuation to stdout
//   trainer --config C --export-hf DIR
//           [--max-shard-size 5GB]
//                           writes DIR/config.json and DIR/model.safetensors (models/gpt/hf_gpt2.h,
//                           models/llama/hf_llama.h: llama's in shards above the size)
//
// Both run in one process, without MPI (under mpirun, rank 0 works and the others exit 0), on
// the weights the config names, in this order: the checkpoint file checkpoint.resume names; the
// newest checkpoint in checkpoint.dir that verifies (whatever checkpoint.resume says); the
// weights of model.init_from. With none of them, --generate samples from the untrained model
// (saying so) and --export-hf refuses. The model is built as training builds it, from the config
// (data.vocab_size, data.context for its shape; no data is read). A user mistake (not a
// language model, a checkpoint that does not fit, no weights to export, a bad option) is a message and exit
// code 2.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "launcher/config.h"
#include "models/model.h"

namespace launcher {

struct GenerateArgs {
  std::string prompt;
  int64_t max_new_tokens = 256;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 200;       // 0: every id
  uint64_t seed = 1337;
};

// The exit codes of the two commands (launcher/exit_codes.h).
int run_generate(const std::string& config_path, const std::vector<std::string>& overrides,
                 const GenerateArgs& args);
int run_export_hf(const std::string& config_path, const std::vector<std::string>& overrides,
                  const std::string& dir, const std::string& max_shard_size = "5GB");

// data.tokenizer, with auto resolved by data.vocab_size (bytes up to 256, gpt2 at 50257).
// Throws std::invalid_argument naming the key when auto cannot choose or the tokenizer's ids do
// not fit data.vocab_size.
std::unique_ptr<data::Tokenizer> tokenizer_for(const data::DataOptions& options);

// train.sample_every's sampler for the Trainer (train/trainer.h): `sample_tokens` new tokens
// after train.sample_prompt (empty: the first 16 tokens of the first validation sequence, else
// training sequence), seed train.seed, temperature 0.8, top-k 200, returned as an escaped
// one-line string. Throws std::invalid_argument naming train.sample_every for a model that is
// not a gpt.
std::function<std::string()> make_training_sampler(std::shared_ptr<models::Model> model,
                                                   const Config& config,
                                                   const data::Dataset& dataset);

}  // namespace launcher
