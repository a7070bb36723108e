// Hugging Face GPT-2 weights in and out of Gpt: model.init_from and `trainer --export-hf`.
//
// Hugging Face's layout (GPT2LMHeadModel.save_pretrained; models/lm/hf_format.h): a directory
// with config.json (n_layer, n_head, n_embd, n_positions, vocab_size, ...) and model.safetensors
// (or its shards and index), whose keys are Gpt's parameter names with a "transformer." prefix
// (some files have none):
//   transformer.wte.weight [vocab, d]   transformer.wpe.weight [positions, d]
//   transformer.h.N.attn.c_attn.weight [d, 3d] ... transformer.ln_f.bias [d]
// GPT-2's Conv1D layers (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) store their weights
// [in, out], transposed against Gpt's Linear [out, in]; reading and writing transpose them.
// lm_head.weight, where present, is the tied output layer: it must equal wte.weight (Gpt cannot
// hold an untied one) and is not written. The causal-mask buffers older files carry
// (h.N.attn.bias, h.N.attn.masked_bias) are not weights and are passed over.
//
// The vocabulary: the file holds `vocab` rows of wte, Gpt padded_vocab_size rows; reading pads
// with zero rows and writing drops them (models/lm/hf_format.h says why).
//
// model.init_from also takes one of the trainer's checkpoints (keys "param.<name>", the padded
// wte included): its parameters are taken as they are; the optimizer state and step are not.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/lm/hf_ranges.h"

namespace models {

// A GPT-2's dimensions as a file gives them; 0 where it does not say (heads, without a
// config.json).
struct Gpt2Dims {
  int64_t num_layers = 0;
  int64_t heads = 0;
  int64_t d_model = 0;
  int64_t context = 0;       // positions (n_positions, rows of wpe)
  int64_t vocab_size = 0;    // Hugging Face: the real vocabulary; checkpoint: 0 (see padded_vocab)
  int64_t padded_vocab = 0;  // checkpoint: rows of wte (padded); Hugging Face: 0
};

// The dimensions a GPT-2 config.json gives (n_layer, n_head, n_embd, n_positions, vocab_size)
// into `dims`, after its architecture's options are checked: read_gpt_init's reading of the
// config.json beside the weights. Throws std::invalid_argument naming model.init_from, the file
// and the key.
void read_gpt2_config(const std::string& file, Gpt2Dims& dims);

// What model.init_from holds.
struct GptInit {
  std::string path;         // as given
  std::string file;         // the safetensors file(s) read (comma-separated)
  std::string config_file;  // the config.json read beside it ("" without one)
  std::string kind;         // "Hugging Face GPT-2" or "trainer checkpoint"
  Gpt2Dims dims;            // from config.json where present, else from the tensors' shapes
  std::map<std::string, at::Tensor> weights;  // by Gpt's names, Linear layout, float32, CPU
  // The files' key prefix: "transformer." or "" (Hugging Face), "param." (a checkpoint).
  std::string prefix;
};

// Reads `path`: a Hugging Face GPT-2 directory (config.json + model.safetensors or its shards),
// a model.safetensors file (a config.json beside it is read too), or a trainer checkpoint. Throws
// std::invalid_argument naming model.init_from and the file for a missing or unreadable file,
// a tensor with an unexpected name or shape, or an untied lm_head.
// Without `weights`, the headers only (dimensions from the shapes): a model built without storage
// reads its ranges later (defer_gpt_init).
GptInit read_gpt_init(const std::string& path, bool weights = true);

// Hugging Face's (or a checkpoint's, `prefix` "param.") tensors as rows of the model's
// parameters (models/lm/hf_ranges.h): the Conv1D weights transposed, wte's real vocabulary its
// first rows (a checkpoint's: all of them); `head_in_file`: an lm_head.weight checked equal to wte.
HfMap gpt_hf_map(const GptOptions& options, const ParameterShapes& shapes,
                 const std::string& prefix, bool head_in_file = false);

// model.init_from for a model built without storage (models/deferred_init.h): the headers
// checked against gpt_hf_map, and the DeferredInit scope's reader set. Throws
// std::invalid_argument naming the file.
void defer_gpt_init(const GptInit& init, Gpt& model);

// Fills the dimensions of `options` that `set` leaves at 0 from `init`, and checks the others:
// a dimension the config sets (non-zero in `set`: num_layers, heads, d_model, context;
// vocab_size always) that differs from the file's is std::invalid_argument naming the key, the
// file and both values.
void apply_init_dims(const GptInit& init, const Gpt2Dims& set, GptOptions& options);

// Copies init.weights into `model` (under no-grad), transposing nothing (read_gpt_init did) and
// padding wte with zero rows. Throws std::invalid_argument naming both shapes for a tensor whose
// shape differs from the model's, and for a missing or extra tensor.
void load_gpt_init(const GptInit& init, Gpt& model);

// config.json for `model`: GPT-2's architecture keys with the model's dimensions (dropout 0).
std::string hf_gpt2_config_json(const Gpt& model);

// Writes `dir`/config.json and the weights as a Hugging Face GPT2LMHeadModel ("transformer."
// names, Conv1D layout, wte without the padded rows, no lm_head: it is tied) in `dtype`, sharded
// above max_shard_bytes, one tensor at a time from `read` (when empty, the model's own
// parameters; with LoRA adapters, the base with them merged in: models/lm/hf_ranges.h,
// export_reader). Returns the weight files written (the index last). Throws std::runtime_error
// naming the file that cannot be written.
std::vector<std::string> export_hf_gpt2(Gpt& model, const std::string& dir, int64_t max_shard_bytes,
                                        const ParameterReader& read = {},
                                        at::ScalarType dtype = at::kFloat);

}  // namespace models
