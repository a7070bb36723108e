#include "models/llama/hf_llama.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <stdexcept>

#include "models/llama/llama.h"
#include "models/lm/hf_format.h"

namespace models {
namespace {

using nlohmann::json;

const std::string kLlamaPrefix = "model.";
const std::string kLmHead = "lm_head.weight";
const std::string kEmbed = "embed_tokens.weight";

// rope_scaling (transformers 4) or rope_parameters (transformers 5: the theta inside it too).
void read_rope(const HfConfig& r, RopeOptions& rope) {
  rope.theta = r.number("rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (const json* p = r.find(key)) read_rope_entry(r, key, *p, rope);
  }
}

// Llama's fused projection holds q_proj's rows, then k_proj's, then v_proj's (llama.h).
const char* const kQkv[] = {"q_proj", "k_proj", "v_proj"};

// layers.N.self_attn.{q,k,v}_proj.{weight,bias} -> layers.N.self_attn.qkv_proj.*, in place.
void fuse_qkv(std::map<std::string, at::Tensor>& w, const std::string& where) {
  static const std::regex q(R"((layers\.\d+\.self_attn\.)q_proj\.(weight|bias))");
  std::vector<std::pair<std::string, std::string>> found;  // (prefix, weight|bias)
  for (const auto& [name, t] : w) {
    std::smatch m;
    if (std::regex_match(name, m, q)) found.emplace_back(m[1], m[2]);
  }
  for (const auto& [prefix, what] : found) {
    std::vector<at::Tensor> parts;
    for (const char* proj : kQkv) {
      auto it = w.find(prefix + proj + "." + what);
      if (it == w.end()) {
        throw init_error(fmt::format("{}: model.{}q_proj.{} but no model.{}{}.{}", where, prefix,
                                     what, prefix, proj, what));
      }
      parts.push_back(it->second);
      w.erase(it);
    }
    if (parts[0].dim() != parts[1].dim() ||
        (parts[0].dim() == 2 && parts[0].size(1) != parts[1].size(1))) {
      throw init_error(fmt::format("{}: model.{}q_proj.{} {} and k_proj {} do not fit together",
                                   where, prefix, what, shape_text(parts[0]),
                                   shape_text(parts[1])));
    }
    w.emplace(prefix + "qkv_proj." + what, at::cat(parts, 0));
  }
}

// The passed-over tensors of a file: rotary frequencies some older files carry.
bool rotary_buffer(const std::string& key) {
  static const std::regex rotary(
      R"((model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq|model\.rotary_emb\.inv_freq)");
  return std::regex_match(key, rotary);
}

// The file's tensors by Llama's names (float32), lm_head dropped where it is the tied embedding.
std::map<std::string, at::Tensor> model_weights(std::map<std::string, at::Tensor> file,
                                                const LlamaOptions& o, const std::string& where) {
  std::map<std::string, at::Tensor> out;
  for (auto& [key, tensor] : file) {
    if (rotary_buffer(key)) continue;
    if (!at::isFloatingType(tensor.scalar_type())) {
      throw init_error(fmt::format("{}: tensor '{}' has dtype {}; a floating dtype is needed",
                                   where, key, c10::toString(tensor.scalar_type())));
    }
    const std::string name =
        key.rfind(kLlamaPrefix, 0) == 0 ? key.substr(kLlamaPrefix.size()) : key;
    out.emplace(name, tensor.to(at::kFloat));
  }
  fuse_qkv(out, where);
  auto head = out.find(kLmHead);
  if (o.tie_embeddings && head != out.end()) {
    auto embed = out.find(kEmbed);
    if (embed == out.end() || !at::equal(head->second, embed->second)) {
      throw init_error(fmt::format(
          "{}: lm_head.weight differs from model.embed_tokens.weight, but config.json has "
          "tie_word_embeddings true",
          where));
    }
    out.erase(head);
  }
  return out;
}

// The model's dimensions, for messages.
std::string config_of(const LlamaOptions& o) {
  return fmt::format(
      "{} blocks, d_model {}, heads {} over {} kv heads of {}, intermediate {}, vocab {}",
      o.num_layers, o.d_model, o.heads, o.resolved_kv_heads(), o.resolved_head_dim(),
      o.intermediate, o.vocab_size);
}

}  // namespace

void read_rope_entry(const HfConfig& r, const std::string& key, const json& p, RopeOptions& rope) {
  if (!p.is_object()) throw init_error(fmt::format("{}: {}: not an object", r.file(), key));
  const HfConfig s(p, r.file() + " " + key);
  rope.theta = s.number("rope_theta", rope.theta);
  const char* type_key = s.find("rope_type") ? "rope_type" : "type";
  const json* type = s.find(type_key);
  const std::string name = type && type->is_string() ? type->get<std::string>() : "default";
  if (s.number("partial_rotary_factor", 1.0) != 1.0) {
    throw s.bad("partial_rotary_factor", "llama rotates whole heads");
  }
  if (name == "default") return;
  if (name == "linear") {
    rope.scaling = "linear";
    rope.factor = s.number("factor", 1.0);
    return;
  }
  if (name != "llama3") {
    throw s.bad(type_key,
                fmt::format("rope type '{}': llama knows default, linear and llama3", name));
  }
  rope.scaling = "llama3";
  rope.factor = s.number("factor", rope.factor);
  rope.low_freq_factor = s.number("low_freq_factor", rope.low_freq_factor);
  rope.high_freq_factor = s.number("high_freq_factor", rope.high_freq_factor);
  rope.original_context = s.integer("original_max_position_embeddings");
}

json rope_entry_json(const RopeOptions& rope) {
  if (rope.scaling == "linear") {
    return {{"rope_type", "linear"}, {"factor", rope.factor}, {"rope_theta", rope.theta}};
  }
  if (rope.scaling == "llama3") {
    return {{"rope_type", "llama3"},
            {"factor", rope.factor},
            {"low_freq_factor", rope.low_freq_factor},
            {"high_freq_factor", rope.high_freq_factor},
            {"original_max_position_embeddings", rope.original_context},
            {"rope_theta", rope.theta}};
  }
  return {{"rope_type", "default"}, {"rope_theta", rope.theta}};
}

const LlamaDialect& llama_dialect() {
  static const LlamaDialect dialect = [] {
    LlamaDialect d;
    d.read = [](const HfConfig& r, LlamaOptions& o) {
      o.attention_bias = r.flag("attention_bias", false);
      o.mlp_bias = r.flag("mlp_bias", false);
    };
    d.write = [](const LlamaOptions& o, json& c) {
      c["attention_bias"] = o.attention_bias;
      c["mlp_bias"] = o.mlp_bias;
      c["pretraining_tp"] = 1;
    };
    return d;
  }();
  return dialect;
}

void read_layer_windows(const HfConfig& r, LlamaOptions& o) {
  if (!r.flag("use_sliding_window", false)) return;  // transformers sets sliding_window to None
  o.sliding_window = r.integer("sliding_window");
  o.sliding_layers.assign(static_cast<size_t>(o.num_layers), false);
  if (r.find("layer_types") == nullptr) {
    const int64_t from = r.integer_or("max_window_layers", 28);  // Qwen2Config's default
    for (int64_t i = from; i < o.num_layers; ++i) o.sliding_layers[static_cast<size_t>(i)] = true;
    return;
  }
  o.sliding_layers = read_layer_types(r, o.num_layers);
}

std::vector<bool> read_layer_types(const HfConfig& r, int64_t layers) {
  const json* types = r.find("layer_types");
  if (!types->is_array() || static_cast<int64_t>(types->size()) != layers) {
    throw r.bad("layer_types",
                fmt::format("a list of num_hidden_layers ({}) layer types is needed", layers));
  }
  std::vector<bool> sliding(types->size());
  for (size_t i = 0; i < types->size(); ++i) {
    const json& t = (*types)[i];
    if (t != "full_attention" && t != "sliding_attention") {
      throw r.bad("layer_types", fmt::format("entry {} is {}: full_attention or sliding_attention "
                                             "are known",
                                             i, t.dump()));
    }
    sliding[i] = t == "sliding_attention";
  }
  return sliding;
}

json layer_types_json(const LlamaOptions& o) {
  json types = json::array();
  for (int64_t i = 0; i < o.num_layers; ++i) {
    types.push_back(o.window_of(i) > 0 ? "sliding_attention" : "full_attention");
  }
  return types;
}

void write_layer_windows(const LlamaOptions& o, json& c) {
  c["use_sliding_window"] = o.sliding_window > 0;
  c["sliding_window"] = o.sliding_window > 0 ? json(o.sliding_window) : json(nullptr);
  c["max_window_layers"] = o.num_layers;
  c["layer_types"] = layer_types_json(o);
}

LlamaOptions read_llama_config(const std::string& file, const LlamaDialect& dialect) {
  const HfConfig r = HfConfig::read(file);
  if (r.find("vision_config") != nullptr) {
    throw init_error(fmt::format("{}: vision_config: a multimodal model's config; model.name {} "
                                 "reads the text model alone (a {}'s directory, model_type {})",
                                 file, dialect.family, dialect.hf_class, dialect.model_type));
  }
  if (const json* t = r.find("model_type"); t && *t != dialect.model_type) {
    throw r.bad("model_type", fmt::format("not a {} (model_type {}); model.name {} reads it",
                                          dialect.hf_class, dialect.model_type, dialect.family));
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (const json* a = r.find(key); a && *a != dialect.activation) {
      throw r.bad(key, fmt::format("{}'s MLP takes {}", dialect.family, dialect.activation));
    }
  }
  LlamaOptions o;
  o.family = dialect.family;
  o.d_model = r.integer("hidden_size");
  o.intermediate = r.integer("intermediate_size");
  o.num_layers = r.integer("num_hidden_layers");
  o.heads = r.integer("num_attention_heads");
  o.kv_heads = r.integer_or("num_key_value_heads", o.heads);
  o.head_dim = r.integer_or("head_dim", o.d_model % o.heads == 0 ? o.d_model / o.heads : -1);
  if (o.head_dim < 0) o.head_dim = 0;  // check_llama_options says heads must divide d_model
  o.context = r.integer_or("max_position_embeddings", 2048);
  o.vocab_size = r.integer("vocab_size");
  o.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  if (dialect.read_rope) {
    dialect.read_rope(r, o);
  } else {
    read_rope(r, o.rope);
  }
  o.tie_embeddings = r.flag("tie_word_embeddings", false);  // every family's config default
  if (dialect.read) dialect.read(r, o);
  if (dialect.fix) dialect.fix(o);
  try {
    check_llama_options(o);
  } catch (const std::invalid_argument& e) {
    throw init_error(fmt::format(
        "{}: {} (from the file's hidden_size {}, num_attention_heads {}, num_key_value_heads {}, "
        "head_dim {}, rope_theta {}, rms_norm_eps {})",
        file, e.what(), o.d_model, o.heads, o.kv_heads, o.head_dim, o.rope.theta, o.rms_norm_eps));
  }
  return o;
}

LlamaInit read_llama_init(const std::string& path, bool weights, const LlamaDialect& dialect) {
  LlamaInit init;
  init.path = path;
  const HfFiles files = find_hf_files(
      path, fmt::format("a Hugging Face {} saved with save_pretrained", dialect.hf_class));
  if (files.config_file.empty()) {
    throw init_error(fmt::format("{}: no config.json beside the weights (a {}'s architecture "
                                 "comes from it)",
                                 path, dialect.family));
  }
  init.config_file = files.config_file;
  init.options = read_llama_config(init.config_file, dialect);
  init.files = files.files;
  if (weights) init.weights = model_weights(read_hf_tensors(files), init.options, files.where());
  return init;
}

void apply_llama_init(const LlamaInit& init, const LlamaDimsSet& set, LlamaOptions& o) {
  const LlamaOptions& f = init.options;
  const struct {
    const char* key;
    const char* file_key;
    int64_t set, file;
  } dims[] = {
      {"model.num_layers", "num_hidden_layers", set.num_layers, f.num_layers},
      {"model.heads", "num_attention_heads", set.heads, f.heads},
      {"model.kv_heads", "num_key_value_heads", set.kv_heads, f.resolved_kv_heads()},
      {"model.head_dim", "head_dim", set.head_dim, f.resolved_head_dim()},
      {"model.d_model", "hidden_size", set.d_model, f.d_model},
      {"model.intermediate_size", "intermediate_size", set.intermediate, f.intermediate},
  };
  for (const auto& d : dims) {
    if (d.set != 0 && d.set != d.file) {
      throw init_error(fmt::format("{} has {} {}, the config has {} = {}", init.config_file,
                                   d.file_key, d.file, d.key, d.set));
    }
  }
  if (set.sliding_window != 0 && set.sliding_window != f.sliding_window) {
    throw init_error(fmt::format("{} has a sliding window of {} (0: none), the config has "
                                 "model.sliding_window = {}",
                                 init.config_file, f.sliding_window, set.sliding_window));
  }
  if (f.vocab_size != o.vocab_size) {
    throw init_error(fmt::format("{} has vocab_size {}, the config has data.vocab_size = {}",
                                 init.config_file, f.vocab_size, o.vocab_size));
  }
  LlamaOptions merged = f;
  merged.padded_vocab_size = 0;
  merged.context = o.context > 0 ? o.context : f.context;
  merged.dropout = o.dropout;
  merged.checkpoint_activations = o.checkpoint_activations;
  merged.loss_chunk_rows = o.loss_chunk_rows;
  o = merged;
}

void load_llama_init(const LlamaInit& init, torch::nn::Module& model, const LlamaOptions& o) {
  HfLoad how;
  how.where = fmt::format("{}", fmt::join(init.files, ", "));
  how.config = config_of(o);
  how.vocab_size = o.vocab_size;
  how.vocab_rows = {kEmbed, kLmHead};
  how.file_name = [](const std::string& name) {
    return name == kLmHead ? name : kLlamaPrefix + name;
  };
  load_hf_weights(init.weights, model, how);
}

HfMap llama_hf_map(const LlamaOptions& o, const ParameterShapes& shapes, bool tied_head_in_file) {
  static const std::regex fused(R"((layers\.\d+\.self_attn\.)qkv_proj\.(weight|bias))");
  const int64_t hd = o.resolved_head_dim(), kv = o.resolved_kv_heads() * hd;
  const int64_t q_rows[] = {0, o.heads * hd, o.heads * hd + kv};
  const int64_t q_counts[] = {o.heads * hd, kv, kv};
  HfMap map;
  for (const auto& [name, shape] : shapes) {
    std::smatch m;
    if (std::regex_match(name, m, fused)) {
      for (size_t i = 0; i < 3; ++i) {
        map.push_back({fmt::format("{}{}{}.{}", kLlamaPrefix, m[1].str(), kQkv[i], m[2].str()),
                       name, q_rows[i], q_counts[i]});
      }
    } else if (name == kEmbed || name == kLmHead) {
      map.push_back({name == kLmHead ? kLmHead : kLlamaPrefix + name, name, 0, o.vocab_size});
    } else {
      map.push_back({kLlamaPrefix + name, name, 0, shape.empty() ? 1 : shape[0]});
    }
  }
  if (o.tie_embeddings && tied_head_in_file) {
    map.push_back({kLmHead, kEmbed, 0, o.vocab_size, false, /*check_only=*/true});
  }
  return map;
}

void defer_llama_init(const LlamaInit& init, torch::nn::Module& model, const LlamaOptions& o) {
  DeferredInit* scope = DeferredInit::current();
  if (scope == nullptr) throw std::logic_error("defer_llama_init outside a DeferredInit scope");
  const HfFiles files = find_hf_files(init.path, "a Hugging Face Llama");
  const auto headers = read_hf_headers(files);
  const ParameterShapes shapes = parameter_shapes(model);
  HfMap map = llama_hf_map(o, shapes, headers.count(kLmHead) > 0);
  check_hf_map(map, headers, shapes, rotary_buffer, files.where(), config_of(o));
  scope->record().read = hf_range_reader(files, std::move(map), shapes);
  scope->record().source = "model.init_from " + init.path;
}

std::string hf_llama_config_json(const LlamaOptions& o, const LlamaDialect& dialect) {
  json c = {
      {"architectures", {dialect.hf_class}},
      {"model_type", dialect.model_type},
      {"hidden_size", o.d_model},
      {"intermediate_size", o.intermediate},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.heads},
      {"num_key_value_heads", o.resolved_kv_heads()},
      {"head_dim", o.resolved_head_dim()},
      {"max_position_embeddings", o.context},
      {"vocab_size", o.vocab_size},
      {"hidden_act", dialect.activation},
      {"rms_norm_eps", o.rms_norm_eps},
      {"rope_theta", o.rope.theta},
      {"rope_scaling", nullptr},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", o.tie_embeddings},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"torch_dtype", "float32"},
  };
  if (o.rope.scaling != "none") {
    c["rope_scaling"] = rope_entry_json(o.rope);
    c["rope_scaling"].erase("rope_theta");
  }
  if (dialect.write) dialect.write(o, c);
  return c.dump(2) + "\n";
}

std::vector<std::string> export_hf_llama(torch::nn::Module& model, const LlamaOptions& o,
                                         const std::string& dir, int64_t max_shard_bytes,
                                         const ParameterReader& read, const LlamaDialect& dialect,
                                         at::ScalarType dtype) {
  const ParameterShapes shapes = read ? parameter_shapes(model) : export_shapes(model);
  return write_hf_streaming(dir, hf_llama_config_json(o, dialect), llama_hf_map(o, shapes), shapes,
                            read ? read : export_reader(model), max_shard_bytes, dtype);
}

// The family's map over the model's own parameters (models/lm/causal_lm.h).
HfMap Llama::hf_map(const ParameterShapes& shapes) const { return llama_hf_map(options_, shapes); }

}  // namespace models
