// Hugging Face Llama weights in and out of Llama: model.init_from and `trainer --export-hf`.
//
// Hugging Face's layout (LlamaForCausalLM.save_pretrained; models/lm/hf_format.h): a directory
// with config.json and model.safetensors, or, above the maximum shard size,
// model-0000k-of-0000N.safetensors shards and model.safetensors.index.json. Its keys are Llama's
// parameter names with a "model." prefix, but for lm_head.weight:
//   model.embed_tokens.weight [vocab, d]  model.layers.N.self_attn.q_proj.weight [heads*hd, d]
//   ... model.layers.N.mlp.down_proj.weight [d, intermediate]  model.norm.weight [d]
//   lm_head.weight [vocab, d] (untied models; a tied one may carry it, equal to embed_tokens)
// Linear weights are [out, in] on both sides: nothing is transposed. The rotary inv_freq buffers
// some older files carry are not weights and are passed over.
//
// config.json gives the architecture (hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings, vocab_size,
// rms_norm_eps, rope_theta, rope_scaling or transformers 5's rope_parameters, attention_bias,
// mlp_bias, tie_word_embeddings); a value Llama cannot take (an unknown rope type, an activation
// other than silu) or options that do not fit together are std::invalid_argument naming the file.
//
// The vocabulary: the file's rows first and zero padded rows; writing drops them
// (models/lm/hf_format.h says why).
//
// Llama's kin (Qwen2, Qwen3, Mistral: models/llama/llama_family.h) store the same tensors under
// the same names (Qwen3 adds self_attn.q_norm and k_norm, Qwen2 the q, k and v biases) and spell
// config.json with keys of their own: a LlamaDialect says which, so that one reader and one
// writer serve every family of the block.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/llama/llama_options.h"
#include "models/lm/hf_ranges.h"

namespace models {

class HfConfig;  // models/lm/hf_format.h

// How a family of the Llama block spells config.json.
struct LlamaDialect {
  std::string family = "llama";               // model.name
  std::string title = "Llama";                // the family in messages
  std::string model_type = "llama";           // config.json's model_type
  std::string hf_class = "LlamaForCausalLM";  // its architectures entry
  const char* activation = "silu";            // hidden_act / hidden_activation: the MLP's
  // What the architecture fixes whatever the file or the preset says (Qwen2's q, k and v biases,
  // Qwen3's q and k norms); null: nothing.
  void (*fix)(LlamaOptions& options) = nullptr;
  // The family's own keys of config.json into `options`, read after the keys every family shares
  // (sizes, heads, head_dim, positions, vocabulary, eps, rope, tie_word_embeddings, an activation
  // other than silu refused); throws config.bad(key, why) for a value the model cannot take.
  void (*read)(const HfConfig& config, LlamaOptions& options) = nullptr;
  // The rotary keys (null: rope_theta and rope_scaling or rope_parameters into options.rope),
  // read before `read`.
  void (*read_rope)(const HfConfig& config, LlamaOptions& options) = nullptr;
  // Writes them into `config`, beside the shared keys.
  void (*write)(const LlamaOptions& options, nlohmann::json& config) = nullptr;
};
// Llama's own: attention_bias and mlp_bias.
const LlamaDialect& llama_dialect();

// Hugging Face's layer_types as Qwen2 and Qwen3 read them: use_sliding_window, sliding_window,
// and the layers it applies to (layer_types' "sliding_attention", else those from
// max_window_layers on). Without use_sliding_window, no window.
void read_layer_windows(const HfConfig& config, LlamaOptions& options);
// layer_types (present): true for each "sliding_attention" of the `layers` entries; throws
// config.bad naming the key for another length or kind.
std::vector<bool> read_layer_types(const HfConfig& config, int64_t layers);
// And written back: use_sliding_window, sliding_window (null without), max_window_layers and
// layer_types.
void write_layer_windows(const LlamaOptions& options, nlohmann::json& config);
// Hugging Face's layer_types for the options: "sliding_attention" where a layer has a window,
// else "full_attention".
nlohmann::json layer_types_json(const LlamaOptions& options);

// One rope entry of config.json (rope_scaling, rope_parameters, or one of Gemma 3's
// rope_parameters by layer type) over `rope`: rope_theta, rope_type default, linear or llama3
// and their keys. Throws config.bad(key, why) for another type or a partial rotary factor.
void read_rope_entry(const HfConfig& config, const std::string& key, const nlohmann::json& entry,
                     RopeOptions& rope);
// And written (rope_type, rope_theta, the scaling's keys), as transformers 5 spells an entry.
nlohmann::json rope_entry_json(const RopeOptions& rope);

// What model.init_from holds.
struct LlamaInit {
  std::string path;                // as given
  std::string config_file;         // its config.json
  std::vector<std::string> files;  // the safetensors files read
  LlamaOptions options;            // config.json's architecture (no padded vocabulary, dropout)
  std::map<std::string, at::Tensor> weights;  // by Llama's names, float32, CPU
};

// The architecture of a Llama config.json. Throws std::invalid_argument naming
// "model.init_from: FILE" and the key for a missing, mistyped or unsupported value.
LlamaOptions read_llama_config(const std::string& file,
                               const LlamaDialect& dialect = llama_dialect());

// Reads `path`: a directory (config.json + model.safetensors or a sharded index), or a
// model.safetensors file with a config.json beside it; without `weights`, config.json and the
// list of files only (a model built without storage reads its ranges later: defer_llama_init).
// Throws std::invalid_argument naming model.init_from and the file.
LlamaInit read_llama_init(const std::string& path, bool weights = true,
                          const LlamaDialect& dialect = llama_dialect());

// The dimension keys the config sets (0: not set) that must agree with the file's.
struct LlamaDimsSet {
  int64_t num_layers = 0, heads = 0, kv_heads = 0, head_dim = 0, d_model = 0, intermediate = 0;
  int64_t sliding_window = 0;  // model.sliding_window (0: not set)
};

// `options` with the file's architecture (dropout, checkpointing, chunking and context kept
// where set): a dimension the config sets that differs from the file's, and a data.vocab_size
// other than the file's, are std::invalid_argument naming the key, the file and both values;
// options that the model cannot take are std::invalid_argument naming config.json.
void apply_llama_init(const LlamaInit& init, const LlamaDimsSet& set, LlamaOptions& options);

// Copies init.weights into `model` (Llama's named parameters, under no-grad), padding the
// vocabulary rows with zeros. Throws std::invalid_argument naming the file and both shapes for
// a tensor of another shape, and for a missing or extra tensor.
void load_llama_init(const LlamaInit& init, torch::nn::Module& model, const LlamaOptions& options);

// Hugging Face's tensors as rows of the model's parameters (models/lm/hf_ranges.h): q_proj,
// k_proj and v_proj three row ranges of qkv_proj; the embedding's and lm_head's real vocabulary
// their first rows; the rest one to one under "model.". `tied_head_in_file`: a tied model's file
// carries lm_head.weight too (checked equal to the embedding while reading).
HfMap llama_hf_map(const LlamaOptions& options, const ParameterShapes& shapes,
                   bool tied_head_in_file = false);

// model.init_from for a model built without storage (models/deferred_init.h): the files' headers
// checked against llama_hf_map (the same messages as load_llama_init), and the DeferredInit
// scope's reader set to read each rank's ranges from them later. Throws std::invalid_argument
// naming the file.
void defer_llama_init(const LlamaInit& init, torch::nn::Module& model, const LlamaOptions& options);

// config.json for the model (the dialect's class and model_type; dropout 0; rope_theta and
// rope_scaling as the Llama 3.2 files spell them).
std::string hf_llama_config_json(const LlamaOptions& options,
                                 const LlamaDialect& dialect = llama_dialect());

// Writes `dir`/config.json and the weights in `dtype`, sharded above max_shard_bytes, one tensor
// at a time from `read` (when empty, the model's own parameters; with LoRA adapters, the base
// with them merged in: models/lm/hf_ranges.h, export_reader). Returns the weight files written.
// Throws std::runtime_error naming a file that cannot be written.
std::vector<std::string> export_hf_llama(torch::nn::Module& model, const LlamaOptions& options,
                                         const std::string& dir, int64_t max_shard_bytes,
                                         const ParameterReader& read = {},
                                         const LlamaDialect& dialect = llama_dialect(),
                                         at::ScalarType dtype = at::kFloat);

}  // namespace models
