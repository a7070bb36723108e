#include "models/gpt/hf_gpt2.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>
#include <vector>

#include "io/checkpoint_keys.h"
#include "io/safetensors.h"
#include "models/hf_config.h"

namespace models {

using io::read_safetensors;
using io::SafetensorsError;
using io::write_safetensors;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPrefix = "transformer.";
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

std::string shape_of(const at::Tensor& t) { return fmt::format("{}", t.sizes()); }

// config.json's architecture: the keys Gpt's forward depends on must have GPT-2's values.
void check_architecture(const json& c, const std::string& file) {
  const auto bad = [&](const std::string& key, const std::string& why) {
    return init_error(fmt::format("{}: {} = {}: {}", file, key, c[key].dump(), why));
  };
  if (c.contains("model_type") && c["model_type"] != "gpt2") {
    throw bad("model_type", "not a GPT-2 (model_type gpt2)");
  }
  if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
      c["activation_function"] != "gelu_pytorch_tanh") {
    throw bad("activation_function", "gpt uses GELU with the tanh approximation (gelu_new)");
  }
  if (c.contains("layer_norm_epsilon") && c["layer_norm_epsilon"].is_number() &&
      std::abs(c["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12) {
    throw bad("layer_norm_epsilon", "gpt's LayerNorm eps is 1e-5");
  }
  if (c.contains("n_inner") && !c["n_inner"].is_null() && c.contains("n_embd") &&
      c["n_inner"] != 4 * c["n_embd"].get<int64_t>()) {
    throw bad("n_inner", "gpt's MLP is 4 x n_embd wide");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    if (c.contains(key) && c[key] == true) throw bad(key, "gpt has no such option");
  }
  if (c.contains("scale_attn_weights") && c["scale_attn_weights"] == false) {
    throw bad("scale_attn_weights", "gpt scales attention by 1/sqrt(head size)");
  }
  if (c.contains("tie_word_embeddings") && c["tie_word_embeddings"] == false) {
    throw bad("tie_word_embeddings", "gpt's output layer is tied to wte");
  }
}

int64_t config_int(const json& c, const char* key, const std::string& file) {
  if (!c.contains(key)) return 0;
  if (!c[key].is_number_integer() || c[key].get<int64_t>() <= 0) {
    throw init_error(
        fmt::format("{}: {} = {} is not a positive integer", file, key, c[key].dump()));
  }
  return c[key].get<int64_t>();
}

void read_config_json(const std::string& file, Gpt2Dims& dims) {
  json c = read_hf_config(file);
  check_architecture(c, file);
  const std::pair<const char*, int64_t*> keys[] = {{"n_layer", &dims.num_layers},
                                                   {"n_head", &dims.heads},
                                                   {"n_embd", &dims.d_model},
                                                   {"n_positions", &dims.context},
                                                   {"vocab_size", &dims.vocab_size}};
  for (const auto& [key, field] : keys) {
    if (const int64_t v = config_int(c, key, file); v > 0) *field = v;
  }
}

// Sets init.file from `path` (a directory or a file); returns the config.json beside it, or "".
std::string locate_init_file(const std::string& path, GptInit& init) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) {
    throw init_error(fmt::format("{}: no such file or directory", path));
  }
  if (fs::is_directory(path, ec)) {
    init.file = (fs::path(path) / "model.safetensors").string();
    if (!fs::exists(init.file, ec)) {
      throw init_error(fmt::format(
          "{}: the directory holds no model.safetensors (a Hugging Face GPT-2 saved with "
          "save_pretrained(dir, safe_serialization=True))",
          path));
    }
  } else {
    init.file = path;
  }
  const fs::path beside = fs::path(init.file).parent_path() / "config.json";
  return fs::exists(beside, ec) ? beside.string() : std::string();
}

// Fills init.weights (Gpt's names, Linear layout, float32) and init.kind from init.file; a
// Hugging Face lm_head goes to `lm_head`. Returns whether the file is a trainer checkpoint.
bool read_init_weights(GptInit& init, at::Tensor& lm_head) {
  std::map<std::string, at::Tensor> file;
  try {
    file = read_safetensors(init.file);
  } catch (const SafetensorsError& e) {
    throw init_error(e.what());
  }
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
      if (name.rfind(kPrefix, 0) == 0) name = name.substr(kPrefix.size());
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
                                   checkpoint ? kCheckpointParam : kPrefix, name, init.kind));
    }
    if (it->second.dim() != dims) {
      throw init_error(fmt::format("{}: '{}' has shape {}; {} dimensions expected", init.file, name,
                                   shape_of(it->second), dims));
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
        init.file, shape_of(lm_head), shape_of(wte)));
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

}  // namespace

GptInit read_gpt_init(const std::string& path) {
  GptInit init;
  init.path = path;
  const std::string config_file = locate_init_file(path, init);
  at::Tensor lm_head;
  const bool checkpoint = read_init_weights(init, lm_head);
  infer_init_dims(init, lm_head, checkpoint);
  if (!checkpoint && !config_file.empty()) {
    read_config_json(config_file, init.dims);
    init.config_file = config_file;
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
  const std::string config =
      fmt::format("model.num_layers {}, heads {}, d_model {}, context {}, data.vocab_size {}",
                  o.num_layers, o.heads, o.d_model, o.context, o.vocab_size);
  std::set<std::string> used;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // checked first, then copied
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& mine = item.value();
    auto it = init.weights.find(name);
    if (it == init.weights.end()) {
      throw init_error(fmt::format("{}: no tensor for the model's {} {} ({})", init.file, name,
                                   shape_of(mine), config));
    }
    used.insert(name);
    const at::Tensor& w = it->second;
    // Hugging Face's wte has the real vocabulary's rows; the model's is padded.
    const bool unpadded_wte = name == "wte.weight" && w.dim() == 2 && w.size(0) == o.vocab_size &&
                              w.size(1) == mine.size(1);
    if (!unpadded_wte && w.sizes() != mine.sizes()) {
      throw init_error(fmt::format("{}: {} has shape {}{} but the model's is {} ({})", init.file,
                                   name, shape_of(w),
                                   is_conv1d_weight(name) && init.kind != "trainer checkpoint"
                                       ? " (after the Conv1D transpose)"
                                       : "",
                                   shape_of(mine), config));
    }
    copies.emplace_back(mine, w);
  }
  std::vector<std::string> extra;
  for (const auto& [name, w] : init.weights) {
    if (!used.count(name)) extra.push_back(name);
  }
  if (!extra.empty()) {
    throw init_error(fmt::format("{}: tensors the model ({}) does not have: {}", init.file, config,
                                 fmt::join(extra, ", ")));
  }
  at::NoGradGuard no_grad;
  for (auto& [mine, w] : copies) {
    if (w.size(0) == mine.size(0)) {
      mine.copy_(w);
    } else {
      mine.narrow(0, 0, w.size(0)).copy_(w);
      mine.narrow(0, w.size(0), mine.size(0) - w.size(0)).zero_();  // the padded rows
    }
  }
}

std::map<std::string, at::Tensor> hf_gpt2_tensors(Gpt& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    at::Tensor w = item.value().detach().to(at::kCPU, at::kFloat);
    if (item.key() == "wte.weight") w = w.narrow(0, 0, model.options().vocab_size);
    if (is_conv1d_weight(item.key())) w = w.t();
    out.emplace(kPrefix + item.key(), w.contiguous().clone());
  }
  return out;
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

void export_hf_gpt2(Gpt& model, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(fmt::format("cannot create the directory {}: {}", dir, ec.message()));
  const std::string config = (fs::path(dir) / "config.json").string();
  std::ofstream out(config);
  out << hf_gpt2_config_json(model);
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", config));
  // transformers reads the "format" metadata of a safetensors file to know its framework.
  write_safetensors((fs::path(dir) / "model.safetensors").string(), hf_gpt2_tensors(model),
                    {{"format", "pt"}});
}

}  // namespace models
