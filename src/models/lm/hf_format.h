// Hugging Face's save_pretrained format, as every language model's importer and exporter meets it
// (gpt: models/gpt/hf_gpt2.h, llama: models/llama/hf_llama.h): a directory with config.json and
// model.safetensors or, above the maximum shard size, model-0000k-of-0000N.safetensors shards and
// model.safetensors.index.json (io/safetensors_shards.h). What differs by family (the tensors'
// names and layout, the config keys) stays in the family's file; this one holds the rest:
// reading config.json with errors that name the file and the key, finding and reading the
// weights model.init_from names, copying them into a model whose vocabulary rows are padded,
// and writing an export.
//
// The vocabulary: a file holds `vocab_size` rows of the embedding (and of an untied output
// layer); the model holds padded_vocab_size rows. Reading puts the file's rows first and zeros in
// the padded rows: those ids never occur in the data (ids < vocab_size) and their logits are
// masked out of the loss and of sampling, so their value never matters, and zero makes the load
// independent of the seed. Writing drops them.
//
// Errors a user can cause are std::invalid_argument "model.init_from: ..." (init_error: exit 2)
// naming the file; a file that cannot be written is std::runtime_error naming it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"

namespace models {

// A user mistake in the weights model.init_from names: exit 2, naming the key.
std::invalid_argument init_error(const std::string& what);

// "[768, 2304]": a tensor's shape as the weight-loading errors write it.
std::string shape_text(const at::Tensor& t);

// config.json's values, each read once with a message naming the file and the key. A key whose
// value is null counts as absent.
class HfConfig {
 public:
  // `file` parsed as one JSON object; otherwise an init_error naming the file and what is wrong.
  static HfConfig read(const std::string& file);
  HfConfig(nlohmann::json config, std::string file);

  // An init_error "FILE: KEY = VALUE: why".
  std::invalid_argument bad(const std::string& key, const std::string& why) const;
  // The value, or null when absent (or null).
  const nlohmann::json* find(const std::string& key) const;
  // Whether the key is there at all, null included.
  bool has(const std::string& key) const;
  // A positive integer, required.
  int64_t integer(const std::string& key) const;
  // A positive integer, or `fallback` when absent.
  int64_t integer_or(const std::string& key, int64_t fallback) const;
  // A number, or `fallback` when absent.
  double number(const std::string& key, double fallback) const;
  // true or false, or `fallback` when absent.
  bool flag(const std::string& key, bool fallback) const;
  const std::string& file() const { return file_; }

 private:
  nlohmann::json config_;
  std::string file_;
};

// The files model.init_from's path names.
struct HfFiles {
  std::string dir;                 // the directory given ("" when a file was given)
  std::vector<std::string> files;  // the safetensors files, in order
  std::string config_file;         // config.json in the files' directory ("" without one)
  // The files, for messages: "DIR/model.safetensors" or the shards, comma-separated.
  std::string where() const;
};

// `path`: a directory holding model.safetensors or a sharded index (save_pretrained), or one
// safetensors file. Throws an init_error for a missing path and for a directory without weights
// (saying that `what` was expected there: "a Hugging Face GPT-2 saved with save_pretrained").
HfFiles find_hf_files(const std::string& path, const std::string& what);

// Every tensor of the files (a directory's shards checked against its index), as stored. Throws
// an init_error naming the file that cannot be read.
std::map<std::string, at::Tensor> read_hf_tensors(const HfFiles& files);

// How a family's tensors, renamed to the model's parameter names, go into the model.
struct HfLoad {
  std::string where;   // the files, for messages
  std::string config;  // the model's dimensions as the config sets them, for messages
  int64_t vocab_size = 0;
  // The parameters whose rows are the vocabulary (padded in the model).
  std::vector<std::string> vocab_rows;
  // The name the file gives a parameter (for a missing tensor), and what a message says after
  // the file's shape of it (" (after the Conv1D transpose)"); identity and "" when not set.
  std::function<std::string(const std::string&)> file_name;
  std::function<std::string(const std::string&)> shape_note;
};

// Copies `weights` (by parameter name, float32, CPU) into `model`'s parameters under no-grad, the
// padded vocabulary rows zero. Checks everything before copying anything: a parameter without a
// tensor, a tensor of another shape (both shapes named) and a tensor the model does not have are
// init_errors naming how.where and how.config.
void load_hf_weights(const std::map<std::string, at::Tensor>& weights, torch::nn::Module& model,
                     const HfLoad& how);

// Writes `dir`/config.json (creating `dir`) and `tensors` as save_pretrained does: one
// model.safetensors up to max_shard_bytes, else shards and the index (removing the other
// layout's files an earlier export left). Returns the weight files written (the index last).
std::vector<std::string> write_hf_dir(const std::string& dir, const std::string& config_json,
                                      const std::map<std::string, at::Tensor>& tensors,
                                      int64_t max_shard_bytes);
// The same with the tensors made one at a time, in name order (models/lm/hf_ranges.h).
std::vector<std::string> write_hf_dir(
    const std::string& dir, const std::string& config_json, std::vector<io::TensorEntry> entries,
    const std::function<at::Tensor(const io::TensorEntry&)>& produce, int64_t max_shard_bytes);

}  // namespace models
