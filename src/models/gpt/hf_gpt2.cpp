#include "models/gpt/hf_gpt2.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>
#include <stdexcept>
#include <vector>

#include "io/checkpoint_keys.h"
#include "models/lm/hf_format.h"

namespace models {

namespace {

using nlohmann::json;

const std::string kGpt2Prefix = "transformer.";
const std::string kCheckpointParam(io::kParamKeyPrefix);

// GPT-2's Conv1D weights ([in, out]), by Gpt's name.
bool is_conv1d_weight(const std::string& name) {
  static const std::regex conv(
      R"(h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight)");
  return std::regex_match(name, conv);
}

// The causal-mask buffers some GPT-2 files carry: not weights.
bool is_mask_buffer(const std::string& name) {
  static const std::regex mask(R"(h\.\d+\.attn\.(bias|masked_bias))");
  return std::regex_match(name, mask);
}

// config.json's architecture: the keys Gpt's forward depends on must have GPT-2's values.
void check_architecture(const HfConfig& c) {
  const auto is = [&](const char* key, const json& value) {
    const json* v = c.find(key);
    return v != nullptr && *v == value;
  };
  if (c.find("model_type") && !is("model_type", "gpt2")) {
    throw c.bad("model_type", "not a GPT-2 (model_type gpt2)");
  }
  if (c.find("activation_function") && !is("activation_function", "gelu_new") &&
      !is("activation_function", "gelu_pytorch_tanh")) {
    throw c.bad("activation_function", "gpt uses GELU with the tanh approximation (gelu_new)");
  }
  if (std::abs(c.number("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12) {
    throw c.bad("layer_norm_epsilon", "gpt's LayerNorm eps is 1e-5");
  }
  const int64_t inner = c.integer_or("n_inner", 0), width = c.integer_or("n_embd", 0);
  if (inner > 0 && width > 0 && inner != 4 * width) {
    throw c.bad("n_inner", "gpt's MLP is 4 x n_embd wide");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    if (c.flag(key, false)) throw c.bad(key, "gpt has no such option");
  }
  if (!c.flag("scale_attn_weights", true)) {
    throw c.bad("scale_attn_weights", "gpt scales attention by 1/sqrt(head size)");
  }
  if (!c.flag("tie_word_embeddings", true)) {
    throw c.bad("tie_word_embeddings", "gpt's output layer is tied to wte");
  }
}

// Fills init.weights (Gpt's names, Linear layout, float32) and init.kind from init.file; a
// Hugging Face lm_head goes to `lm_head`. Returns whether the file is a trainer checkpoint.
bool read_init_weights(const HfFiles& files, GptInit& init, at::Tensor& lm_head) {
  std::map<std::string, at::Tensor> file = read_hf_tensors(files);
  const bool checkpoint = std::any_of(file.begin(), file.end(), [](const auto& kv) {
    return kv.first.rfind(kCheckpointParam, 0) == 0;
  });
  for (auto& [key, tensor] : file) {
    std::string name = key;
    if (checkpoint) {
      // Parameters only: the optimizer's moments and the step stay behind (a fresh optimizer).
      if (name.rfind(kCheckpointParam, 0) != 0) continue;
      name = name.substr(kCheckpointParam.size());
    } else {
      if (name.rfind(kGpt2Prefix, 0) == 0) name = name.substr(kGpt2Prefix.size());
      if (name == "lm_head.weight") {
        lm_head = tensor;
        continue;
      }
      if (is_mask_buffer(name)) continue;
    }
    if (!at::isFloatingType(tensor.scalar_type())) {
      throw init_error(fmt::format("{}: tensor '{}' has dtype {}; a floating dtype is needed",
                                   init.file, key, c10::toString(tensor.scalar_type())));
    }
    at::Tensor w = tensor.to(at::kFloat);
    if (!checkpoint && is_conv1d_weight(name) && w.dim() == 2) w = w.t().contiguous();
    init.weights.emplace(name, w);
  }
  init.kind = checkpoint ? "trainer checkpoint" : "Hugging Face GPT-2";
  return checkpoint;
}

// init.dims from the tensors' shapes (a tied lm_head checked against wte).
void infer_init_dims(GptInit& init, const at::Tensor& lm_head, bool checkpoint) {
  const auto need = [&](const std::string& name, int64_t dims) -> const at::Tensor& {
    auto it = init.weights.find(name);
    if (it == init.weights.end()) {
      throw init_error(fmt::format("{}: no tensor '{}{}': not a GPT-2 ({})", init.file,
                                   checkpoint ? kCheckpointParam : kGpt2Prefix, name, init.kind));
    }
    if (it->second.dim() != dims) {
      throw init_error(fmt::format("{}: '{}' has shape {}; {} dimensions expected", init.file, name,
                                   shape_text(it->second), dims));
    }
    return it->second;
  };
  const at::Tensor& wte = need("wte.weight", 2);
  const at::Tensor& wpe = need("wpe.weight", 2);
  if (lm_head.defined() &&
      (lm_head.sizes() != wte.sizes() || !at::equal(lm_head.to(at::kFloat), wte))) {
    throw init_error(fmt::format(
        "{}: lm_head.weight {} is not wte.weight {}: an untied output layer, which gpt (tied to "
        "the token embedding) cannot hold",
        init.file, shape_text(lm_head), shape_text(wte)));
  }
  Gpt2Dims& d = init.dims;
  d.d_model = wte.size(1);
  d.context = wpe.size(0);
  (checkpoint ? d.padded_vocab : d.vocab_size) = wte.size(0);
  std::set<int64_t> blocks;
  static const std::regex block(R"(h\.(\d+)\..*)");
  for (const auto& [name, w] : init.weights) {
    std::smatch m;
    if (std::regex_match(name, m, block)) blocks.insert(std::stoll(m[1]));
  }
  d.num_layers = static_cast<int64_t>(blocks.size());
}

// The shape of `key` in `headers`, of `dims` dimensions, or an init_error naming what is missing.
const std::vector<int64_t>& header_shape(const std::map<std::string, HfHeader>& headers,
                                         const GptInit& init, const std::string& key, size_t dims) {
  const auto it = headers.find(key);
  if (it == headers.end()) {
    throw init_error(
        fmt::format("{}: no tensor '{}': not a GPT-2 ({})", init.file, key, init.kind));
  }
  if (it->second.shape.size() != dims) {
    throw init_error(fmt::format("{}: '{}' has shape {}; {} dimensions expected", init.file, key,
                                 it->second.shape, dims));
  }
  return it->second.shape;
}

// read_gpt_init without the weights: the kind, the key prefix and the dimensions from the headers.
void read_init_headers(const HfFiles& files, GptInit& init) {
  const auto headers = read_hf_headers(files);
  const auto any_key = [&](const std::string& start) {
    return std::any_of(headers.begin(), headers.end(),
                       [&](const auto& kv) { return kv.first.rfind(start, 0) == 0; });
  };
  const bool checkpoint = any_key(kCheckpointParam);
  init.kind = checkpoint ? "trainer checkpoint" : "Hugging Face GPT-2";
  init.prefix = checkpoint ? kCheckpointParam : any_key(kGpt2Prefix) ? kGpt2Prefix : "";
  const auto& wte = header_shape(headers, init, init.prefix + "wte.weight", 2);
  const auto& wpe = header_shape(headers, init, init.prefix + "wpe.weight", 2);
  Gpt2Dims& d = init.dims;
  d.d_model = wte[1];
  d.context = wpe[0];
  (checkpoint ? d.padded_vocab : d.vocab_size) = wte[0];
  std::set<int64_t> blocks;
  const std::regex block(std::regex_replace(init.prefix, std::regex(R"(\.)"), R"(\.)") +
                         R"(h\.(\d+)\..*)");
  for (const auto& [name, h] : headers) {
    std::smatch m;
    if (std::regex_match(name, m, block)) blocks.insert(std::stoll(m[1]));
  }
  d.num_layers = static_cast<int64_t>(blocks.size());
}

}  // namespace

void read_gpt2_config(const std::string& file, Gpt2Dims& dims) {
  const HfConfig c = HfConfig::read(file);
  check_architecture(c);
  const std::pair<const char*, int64_t*> keys[] = {{"n_layer", &dims.num_layers},
                                                   {"n_head", &dims.heads},
                                                   {"n_embd", &dims.d_model},
                                                   {"n_positions", &dims.context},
                                                   {"vocab_size", &dims.vocab_size}};
  for (const auto& [key, field] : keys) {
    if (const int64_t v = c.integer_or(key, 0); v > 0) *field = v;
  }
}

GptInit read_gpt_init(const std::string& path, bool weights) {
  GptInit init;
  init.path = path;
  const HfFiles files = find_hf_files(path, "a Hugging Face GPT-2 saved with save_pretrained");
  init.file = files.where();
  at::Tensor lm_head;
  bool checkpoint = false;
  if (weights) {
    checkpoint = read_init_weights(files, init, lm_head);
    infer_init_dims(init, lm_head, checkpoint);
    init.prefix = checkpoint ? kCheckpointParam : kGpt2Prefix;
  } else {
    read_init_headers(files, init);
    checkpoint = init.prefix == kCheckpointParam;
  }
  if (!checkpoint && !files.config_file.empty()) {
    read_gpt2_config(files.config_file, init.dims);
    init.config_file = files.config_file;
  }
  return init;
}

void apply_init_dims(const GptInit& init, const Gpt2Dims& set, GptOptions& o) {
  const std::string from = fmt::format("{} ({})", init.file, init.kind);
  const struct {
    const char* key;
    const char* what;
    int64_t set, file;
    int64_t* field;
  } dims[] = {
      {"model.num_layers", "blocks", set.num_layers, init.dims.num_layers, &o.num_layers},
      {"model.heads", "heads", set.heads, init.dims.heads, &o.heads},
      {"model.d_model", "width", set.d_model, init.dims.d_model, &o.d_model},
      {"model.context", "positions", set.context, init.dims.context, &o.context},
  };
  for (const auto& dim : dims) {
    if (dim.file == 0) continue;
    if (dim.set != 0 && dim.set != dim.file) {
      throw init_error(fmt::format("{} has {} {}, the config has {} = {}", from, dim.what, dim.file,
                                   dim.key, dim.set));
    }
    *dim.field = dim.file;
  }
  if (init.dims.vocab_size > 0 && init.dims.vocab_size != o.vocab_size) {
    throw init_error(fmt::format(
        "{} has a vocabulary of {} (wte.weight [{}, {}]), the config has data.vocab_size = {}",
        from, init.dims.vocab_size, init.dims.vocab_size, init.dims.d_model, o.vocab_size));
  }
}

void load_gpt_init(const GptInit& init, Gpt& model) {
  const GptOptions& o = model.options();
  const bool checkpoint = init.kind == "trainer checkpoint";
  HfLoad how;
  how.where = init.file;
  how.config =
      fmt::format("model.num_layers {}, heads {}, d_model {}, context {}, data.vocab_size {}",
                  o.num_layers, o.heads, o.d_model, o.context, o.vocab_size);
  how.vocab_size = o.vocab_size;
  how.vocab_rows = {"wte.weight"};  // Hugging Face's has the real vocabulary's rows
  how.file_name = [checkpoint](const std::string& name) {
    return (checkpoint ? kCheckpointParam : kGpt2Prefix) + name;
  };
  how.shape_note = [checkpoint](const std::string& name) {
    return !checkpoint && is_conv1d_weight(name) ? " (after the Conv1D transpose)" : "";
  };
  load_hf_weights(init.weights, model, how);
}

HfMap gpt_hf_map(const GptOptions& o, const ParameterShapes& shapes, const std::string& prefix,
                 bool head_in_file) {
  const bool checkpoint = prefix == kCheckpointParam;
  HfMap map;
  for (const auto& [name, shape] : shapes) {
    const int64_t rows = name == "wte.weight" && !checkpoint ? o.vocab_size : shape[0];
    map.push_back({prefix + name, name, 0, rows, !checkpoint && is_conv1d_weight(name)});
  }
  if (head_in_file && !checkpoint) {
    map.push_back({"lm_head.weight", "wte.weight", 0, o.vocab_size, false, /*check_only=*/true});
  }
  return map;
}

void defer_gpt_init(const GptInit& init, Gpt& model) {
  DeferredInit* scope = DeferredInit::current();
  if (scope == nullptr) throw std::logic_error("defer_gpt_init outside a DeferredInit scope");
  const GptOptions& o = model.options();
  const HfFiles files = find_hf_files(init.path, "a Hugging Face GPT-2");
  const auto headers = read_hf_headers(files);
  const ParameterShapes shapes = parameter_shapes(model);
  const bool checkpoint = init.prefix == kCheckpointParam;
  HfMap map = gpt_hf_map(o, shapes, init.prefix, headers.count("lm_head.weight") > 0);
  const auto ignored = [&](const std::string& key) {
    if (checkpoint) return key.rfind(kCheckpointParam, 0) != 0;  // moments, buffers
    const std::string name = key.rfind(kGpt2Prefix, 0) == 0 ? key.substr(kGpt2Prefix.size()) : key;
    return is_mask_buffer(name);
  };
  check_hf_map(map, headers, shapes, ignored, init.file,
               fmt::format("model.num_layers {}, heads {}, d_model {}, context {}, data.vocab_size "
                           "{}",
                           o.num_layers, o.heads, o.d_model, o.context, o.vocab_size));
  scope->record().read = hf_range_reader(files, std::move(map), shapes);
  scope->record().source = "model.init_from " + init.path;
}

std::string hf_gpt2_config_json(const Gpt& model) {
  const GptOptions& o = model.options();
  json c = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"n_layer", o.num_layers},
      {"n_head", o.heads},
      {"n_embd", o.d_model},
      {"n_positions", o.context},
      {"n_ctx", o.context},
      {"vocab_size", o.vocab_size},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"initializer_range", 0.02},
      {"embd_pdrop", o.dropout},
      {"attn_pdrop", o.dropout},
      {"resid_pdrop", o.dropout},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  // GPT-2's <|endoftext|> where the vocabulary is GPT-2's; a byte-level model has none.
  const bool gpt2_vocab = o.vocab_size == 50257;
  c["bos_token_id"] = gpt2_vocab ? json(50256) : json(nullptr);
  c["eos_token_id"] = gpt2_vocab ? json(50256) : json(nullptr);
  return c.dump(2) + "\n";
}

std::vector<std::string> export_hf_gpt2(Gpt& model, const std::string& dir, int64_t max_shard_bytes,
                                        const ParameterReader& read, at::ScalarType dtype) {
  const ParameterShapes shapes = read ? parameter_shapes(model) : export_shapes(model);
  return write_hf_streaming(dir, hf_gpt2_config_json(model),
                            gpt_hf_map(model.options(), shapes, kGpt2Prefix), shapes,
                            read ? read : export_reader(model), max_shard_bytes, dtype);
}

// The family's map over the model's own parameters (models/lm/causal_lm.h).
HfMap Gpt::hf_map(const ParameterShapes& shapes) const {
  return gpt_hf_map(options_, shapes, hf_prefix());
}

}  // namespace models
