// Hugging Face's tensors as rows of the model's parameters (models/lm/hf_format.h): one map per
// family (llama_hf_map, gpt_hf_map) says which rows of which parameter each file tensor holds, so
// that both directions stream:
// - model.init_from under ddp.shard: parameters (a model built without storage,
//   models/deferred_init.h): hf_range_reader reads, for any element range of a parameter, only
//   the bytes of those elements from the files (F32, BF16 or F16, converted to float32), with
//   ranged preads (io::SafetensorsRangeReader), so that each rank reads its blocks and nothing
//   else;
// - an export (--export-hf): write_hf_streaming makes each file tensor from the rows of its
//   parameter that a ParameterReader gives (the model's tensors, or a sharded checkpoint's), one
//   at a time, into files written as they go (io::SafetensorsWriter).
//
// A file tensor is rows of a parameter (HfTensor, models/lm/hf_tensor.h). Rows no file tensor
// gives (the padded vocabulary) read as zeros.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/deferred_init.h"
#include "models/lm/hf_format.h"
#include "models/lm/hf_tensor.h"

namespace models {

// The parameters of `model` by name, and their shapes (metadata only: a model without storage
// has them too).
ParameterShapes parameter_shapes(torch::nn::Module& model);

// A tensor of the files as their headers list it.
struct HfHeader {
  std::string file;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};
// Every tensor of `files` by name, from the headers alone. Throws an init_error naming the file.
std::map<std::string, HfHeader> read_hf_headers(const HfFiles& files);

// Checks `map` against the files before anything is read: every tensor it names is there, of a
// floating dtype, with the shape the parameter's rows make; every tensor of the files is named
// by the map or passed over by `ignored`. Throws init_errors naming `where` (the files), the
// tensor, both shapes and `config` (the model's dimensions).
void check_hf_map(const HfMap& map, const std::map<std::string, HfHeader>& headers,
                  const ParameterShapes& shapes,
                  const std::function<bool(const std::string&)>& ignored, const std::string& where,
                  const std::string& config);

// The reader of models/deferred_init.h over `files`, as `map` lays the parameters out (checked
// by check_hf_map first). Reads only the elements asked for; a check_only tensor that differs is
// an init_error. Not thread-safe.
ParameterReader hf_range_reader(const HfFiles& files, HfMap map, ParameterShapes shapes);

// A reader of the model's own parameters (they hold storage), for an export of a model in memory.
ParameterReader model_reader(torch::nn::Module& model);

// What an export of a model in memory writes, and a reader of it: the model's parameters, or with
// LoRA adapters (lm/lora.h) the frozen base's weights (FrozenBase::frozen_buffer_names, named as
// the parameters were) with each adapter merged in (W + scale B A) as the tensor is read, one
// tensor at a time (lora.h, merged_weight): --export-hf writes the merged model, as PEFT's
// merge_and_unload would.
ParameterShapes export_shapes(torch::nn::Module& model);
ParameterReader export_reader(torch::nn::Module& model);

// Writes `dir`/config.json and the map's tensors (not check_only), in `dtype` (float32, bfloat16
// or float16: --export-dtype), each made from the rows of its parameter that `read` gives, one
// tensor at a time (io::write_safetensors_dir's streaming form: one file, or shards of at most
// max_shard_bytes and the index). config.json's dtype and torch_dtype (the older spelling, which
// vLLM and transformers 4 read) name `dtype`. Returns the weight files written (the index last).
// Throws std::runtime_error naming a file that cannot be written.
std::vector<std::string> write_hf_streaming(const std::string& dir, const std::string& config_json,
                                            const HfMap& map, const ParameterShapes& shapes,
                                            const ParameterReader& read, int64_t max_shard_bytes,
                                            at::ScalarType dtype = at::kFloat);

// transformers' name of a dtype in config.json: "float32", "bfloat16", "float16".
std::string hf_dtype_name(at::ScalarType dtype);

}  // namespace models
