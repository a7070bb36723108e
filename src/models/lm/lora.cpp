#include "models/lm/lora.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"
#include "models/block.h"
#include "models/deferred_init.h"
#include "models/lm/causal_lm.h"

namespace models {
namespace {

// A module's registered parameters, which torch::nn::Module keeps protected: the member named
// through a class derived from it (access by a pointer to member is the language's way in).
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};

// A layer that model.lora_targets may name in a block: its Hugging Face name, the projection
// and the rows of its output it covers, and the module its adapter registers on (the
// projection, or for a slice of a fused projection a new module of that name under `parent`).
struct Candidate {
  std::string name;
  std::string base;  // the projection's name (empty: `name`)
  std::shared_ptr<Projection> projection;
  int64_t offset = 0, rows = 0;
  std::shared_ptr<torch::nn::Module> parent;  // set for a slice only
};

std::shared_ptr<torch::nn::Module> child(torch::nn::Module& m, const std::string& name) {
  return m.named_children()[name];
}

// The layers of `block` model.lora_targets may name, with their names under the block.
std::vector<Candidate> candidates(Block& block, bool split_qkv) {
  const BlockOptions& o = block.options();
  const BlockNames& n = o.names;
  const auto attn = child(block, n.attn), mlp = child(block, n.mlp);
  const auto proj = [](torch::nn::Module& parent, const std::string& name) {
    return std::dynamic_pointer_cast<Projection>(child(parent, name));
  };
  // A whole projection: its own name, every row of its output.
  const auto whole = [](std::string name, std::shared_ptr<Projection> p) {
    Candidate c;
    c.name = std::move(name);
    c.projection = std::move(p);
    return c;
  };
  std::vector<Candidate> out;
  if (split_qkv && o.fused_qkv) {
    const int64_t q = o.heads * o.head_dim, kv = o.kv_heads * o.head_dim;
    const auto qkv = proj(*attn, n.qkv);
    const std::string fused = n.attn + "." + n.qkv;
    out.push_back({n.attn + "." + n.q, fused, qkv, 0, q, attn});
    out.push_back({n.attn + "." + n.k, fused, qkv, q, kv, attn});
    out.push_back({n.attn + "." + n.v, fused, qkv, q + kv, kv, attn});
  } else if (o.fused_qkv) {
    out.push_back(whole(n.attn + "." + n.qkv, proj(*attn, n.qkv)));
  } else {
    for (const std::string* name : {&n.q, &n.k, &n.v})
      out.push_back(whole(n.attn + "." + *name, proj(*attn, *name)));
  }
  out.push_back(whole(n.attn + "." + n.attn_out, proj(*attn, n.attn_out)));
  if (o.mlp != MlpKind::kGelu) out.push_back(whole(n.mlp + "." + n.gate, proj(*mlp, n.gate)));
  out.push_back(whole(n.mlp + "." + n.up, proj(*mlp, n.up)));
  out.push_back(whole(n.mlp + "." + n.mlp_out, proj(*mlp, n.mlp_out)));
  for (Candidate& c : out) {
    if (c.rows == 0) c.rows = c.projection->out_features();
    if (c.base.empty()) c.base = c.name;
  }
  return out;
}

// The last part of a dotted name: what model.lora_targets matches.
std::string leaf(const std::string& name) { return name.substr(name.rfind('.') + 1); }

void check_targets(const std::vector<std::string>& targets, const std::vector<Candidate>& layers,
                   const std::string& family) {
  std::vector<std::string> known;
  for (const Candidate& c : layers) {
    if (std::find(known.begin(), known.end(), leaf(c.name)) == known.end())
      known.push_back(leaf(c.name));
  }
  for (const std::string& t : targets) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      throw std::invalid_argument(
          fmt::format("model.lora_targets: '{}' matches no layer of {}; its layers are {}", t,
                      family, fmt::join(known, ", ")));
    }
  }
}

}  // namespace

LoraOptions lora_options(const ModelOptions& o) {
  LoraOptions l{o.lora_rank, o.lora_alpha, o.lora_dropout, o.lora_targets, o.lora_rslora};
  if (l.rank == 0 && !o.lora_init_from.empty()) {
    throw std::invalid_argument(
        fmt::format("model.lora_rank: 0 with model.lora_init_from {}; set model.lora_rank and "
                    "model.lora_targets to the adapter's r and target_modules",
                    o.lora_init_from));
  }
  if (l.rank == 0 && !l.targets.empty()) {
    throw std::invalid_argument(
        fmt::format("model.lora_rank: 0 with model.lora_targets [{}]; LoRA needs a rank of at "
                    "least 1 (or remove model.lora_targets)",
                    fmt::join(l.targets, ", ")));
  }
  if (l.rank == 0 && l.rslora) {
    throw std::invalid_argument(
        "model.lora_rank: 0 with model.lora_rslora: true; rsLoRA scales adapters, and a rank of 0 "
        "adds none (set model.lora_rank, or remove model.lora_rslora)");
  }
  return l;
}

void freeze_parameters(torch::nn::Module& module) {
  // Module by module (modules() would need the model held by a shared_ptr).
  auto& params = ParameterAccess::of(module);
  const std::vector<std::string> names = params.keys();
  for (const std::string& name : names) {
    at::Tensor t = params[name];
    params.erase(name);
    t.set_requires_grad(false);
    module.register_buffer(name, t);
  }
  for (const auto& child : module.children()) freeze_parameters(*child);
}

void CausalLm::add_lora(const LoraOptions& options) {
  if (options.rank <= 0) return;
  if (!lora_sites_.empty()) throw std::logic_error("CausalLm::add_lora: adapters already added");
  lora_ = options;
  if (lora_.targets.empty()) lora_.targets = dims_.lora_default_targets;
  const double scale = lora_scale(lora_);
  for (const auto& item : named_parameters()) frozen_.push_back(item.key());
  freeze_parameters(*this);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const std::vector<Candidate> layers = candidates(*blocks_[i], dims_.lora_split_qkv);
    if (i == 0) check_targets(lora_.targets, layers, dims_.family);
    const std::string prefix = fmt::format("{}.{}.", dims_.blocks, i);
    for (const Candidate& c : layers) {
      if (std::find(lora_.targets.begin(), lora_.targets.end(), leaf(c.name)) ==
          lora_.targets.end())
        continue;
      const int64_t in = c.projection->in_features();
      if (lora_.rank > std::min(in, c.rows)) {
        throw std::invalid_argument(fmt::format(
            "model.lora_rank: {} is above the smaller dimension ({}) of {}{} ([{}, {}])",
            lora_.rank, std::min(in, c.rows), prefix, c.name, c.rows, in));
      }
      auto adapter =
          std::make_shared<LoraAdapter>(in, c.rows, c.offset, lora_.rank, scale, lora_.dropout);
      torch::nn::Module& host =
          c.parent ? *c.parent->register_module(leaf(c.name), std::make_shared<torch::nn::Module>())
                   : static_cast<torch::nn::Module&>(*c.projection);
      host.register_module("lora_A", adapter->lora_A);
      host.register_module("lora_B", adapter->lora_B);
      c.projection->add_adapter(adapter);
      lora_sites_.push_back({prefix + c.name, prefix + c.base + ".weight", c.projection, adapter});
    }
  }
}

at::Tensor merged_weight(const at::Tensor& base, const std::string& name,
                         const std::vector<LoraSite>& sites) {
  at::NoGradGuard no_grad;
  at::Tensor w = base.detach().to(at::kCPU, at::kFloat);
  bool copied = false;  // .to() may hand back the buffer itself: clone before the first add
  for (const LoraSite& s : sites) {
    if (s.base != name) continue;
    if (!copied) {
      w = w.clone();
      copied = true;
    }
    const LoraAdapter& a = *s.adapter;
    // W [out, in] (or [in, out]) + scale B A on the adapter's rows of the output.
    const at::Tensor delta =
        at::matmul(a.b.detach().to(at::kCPU, at::kFloat), a.a.detach().to(at::kCPU, at::kFloat))
            .mul(a.scale);
    if (s.projection->layout() == WeightLayout::kOutIn) {
      w.narrow(0, a.offset, a.rows).add_(delta);
    } else {
      w.narrow(1, a.offset, a.rows).add_(delta.t());
    }
  }
  return w;
}

std::vector<std::pair<std::string, at::Tensor>> merged_weights(torch::nn::Module& model,
                                                               const std::vector<LoraSite>& sites) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_buffers()) {
    out.emplace_back(item.key(), merged_weight(item.value(), item.key(), sites));
  }
  return out;
}

int64_t parameter_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

int64_t buffer_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& b : module.buffers()) n += b.numel();
  return n;
}

namespace {

constexpr const char* kPeftConfig = "adapter_config.json";
constexpr const char* kPeftWeights = "adapter_model.safetensors";

// PEFT's key of an adapter parameter: base_model.model. + the Hugging Face model's name.
std::string peft_key(const CausalLm& model, const std::string& name) {
  return "base_model.model." + model.hf_prefix() + name;
}

}  // namespace

std::vector<std::string> CausalLm::export_peft(const std::string& dir,
                                               const std::string& base) const {
  return models::export_peft(*this, dir, base);
}

std::vector<std::string> export_peft(const CausalLm& model, const std::string& dir,
                                     const std::string& base_path) {
  if (!model.has_adapters()) {
    throw std::invalid_argument("--export-peft: the model has no adapters (model.lora_rank: 0)");
  }
  const LoraOptions& l = model.lora_options();
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model.named_parameters()) {
    tensors.emplace(peft_key(model, item.key()),
                    item.value().detach().to(at::kCPU, at::kFloat).contiguous());
  }
  // GPT-2's layers are Conv1D in transformers ([in, out] weights, the model under
  // "transformer."): PEFT needs fan_in_fan_out for them.
  const bool conv1d = model.hf_prefix() == "transformer.";
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"task_type", "CAUSAL_LM"},
                                 {"base_model_name_or_path", base_path},
                                 {"r", l.rank},
                                 {"lora_alpha", l.alpha},
                                 {"lora_dropout", l.dropout},
                                 {"target_modules", l.targets},
                                 {"bias", "none"},
                                 {"fan_in_fan_out", conv1d},
                                 {"inference_mode", true},
                                 {"init_lora_weights", true},
                                 {"use_rslora", l.rslora},
                                 {"use_dora", false},
                                 {"modules_to_save", nullptr}};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(fmt::format("cannot create the directory {}: {}", dir, ec.message()));
  }
  const std::string config_path = (std::filesystem::path(dir) / kPeftConfig).string();
  const std::string weights_path = (std::filesystem::path(dir) / kPeftWeights).string();
  std::ofstream out(config_path);
  out << config.dump(2) << "\n";
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", config_path));
  try {
    io::write_safetensors(weights_path, tensors, {{"format", "pt"}});
  } catch (const io::SafetensorsError& e) {
    throw std::runtime_error(e.what());
  }
  return {config_path, weights_path};
}

namespace {

nlohmann::json read_peft_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::invalid_argument(
        fmt::format("model.lora_init_from: cannot read {} (a PEFT adapter directory holds "
                    "{} and {})",
                    path, kPeftConfig, kPeftWeights));
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(
        fmt::format("model.lora_init_from: {}: not JSON: {}", path, e.what()));
  }
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw std::invalid_argument(fmt::format("model.lora_init_from: {}: {}", path, what));
}

// The fields of PEFT's LoraConfig that change what the adapters compute, or which layers and
// tensors they have, beyond W x + scale B A x on every block's target_modules: each is refused
// when set (not absent, null, false, empty or "none"), naming it. fan_in_fan_out is not one:
// PEFT sets it by the layer's type whatever the file says (false for nn.Linear, llama; true for
// GPT-2's Conv1D), so it changes nothing the trainer computes.
void refuse_variants(const nlohmann::json& c, const std::string& path) {
  struct Field {
    const char* name;
    const char* what;
  };
  static const Field kFields[] = {
      {"use_dora", "DoRA (a magnitude vector over the weight) is not LoRA's arithmetic"},
      {"rank_pattern", "a rank per layer is not supported (one model.lora_rank for every layer)"},
      {"alpha_pattern",
       "an alpha per layer is not supported (one model.lora_alpha for every layer)"},
      {"lora_bias", "a bias on lora_B is not supported"},
      {"bias", "trained biases of the base are not supported (bias: none only)"},
      {"modules_to_save", "whole modules trained beside the adapters are not supported"},
      {"trainable_token_indices", "trained token embeddings are not supported"},
      {"layers_to_transform", "adapters on some layers only are not supported (every block)"},
      {"layer_replication", "replicated layers are not supported"},
      {"exclude_modules", "excluded modules are not supported (model.lora_targets, every block)"},
      {"target_parameters", "adapters on parameters (not modules) are not supported"},
      {"use_qalora", "QALoRA is not LoRA's arithmetic"},
      {"alora_invocation_tokens", "Activated LoRA is not LoRA's arithmetic"},
      {"velora_config", "VeLoRA is not supported"},
      {"use_bdlora", "block-diagonal LoRA is not LoRA's arithmetic"},
      {"arrow_config", "Arrow routing is not LoRA's arithmetic"}};
  for (const Field& f : kFields) {
    const auto it = c.find(f.name);
    if (it == c.end() || it->is_null() || *it == false || *it == "none") continue;
    if ((it->is_object() || it->is_array() || it->is_string()) && it->empty()) continue;
    refuse(path,
           fmt::format("{} is {}: {}; save the adapter without it", f.name, it->dump(), f.what));
  }
}

// The config's field `key` when it is there and not null, else nullptr; refused, naming it,
// when `is_kind` does not hold for it (`kind` says what it must be).
const nlohmann::json* peft_field(const nlohmann::json& c, const char* key,
                                 bool (*is_kind)(const nlohmann::json&), const char* kind,
                                 const std::string& path) {
  const auto it = c.find(key);
  if (it == c.end() || it->is_null()) return nullptr;
  if (!is_kind(*it)) refuse(path, fmt::format("{} is {}, not {}", key, it->dump(), kind));
  return &*it;
}

// target_modules as a list of names (absent: none).
std::vector<std::string> peft_targets(const nlohmann::json& c, const std::string& path) {
  const nlohmann::json* t = peft_field(
      c, "target_modules", [](const nlohmann::json& j) { return j.is_array() || j.is_string(); },
      "a list of names", path);
  std::vector<std::string> targets;
  if (t == nullptr) return targets;
  if (t->is_string()) {
    refuse(path, fmt::format("target_modules is the pattern '{}'; a list of names is needed",
                             t->get<std::string>()));
  }
  for (const auto& name : *t) {
    if (!name.is_string()) {
      refuse(path, fmt::format("target_modules holds {}, which is not a module name", name.dump()));
    }
    targets.push_back(name.get<std::string>());
  }
  return targets;
}

// The adapter's config against the model's options: PEFT type, what is not plain LoRA, rank,
// alpha, rsLoRA, targets. Any other JSON than an object with fields of PEFT's types is refused
// naming the field.
void check_peft_config(const LoraOptions& l, const nlohmann::json& c, const std::string& path) {
  const auto fail = [&](const std::string& what) { refuse(path, what); };
  if (!c.is_object()) fail(fmt::format("not a JSON object but {}", c.dump()));
  const auto is_string = [](const nlohmann::json& j) { return j.is_string(); };
  const nlohmann::json* type = peft_field(c, "peft_type", is_string, "a string", path);
  if (type == nullptr || *type != "LORA") {
    fail(fmt::format("peft_type is {}, not LORA", type ? type->get<std::string>() : "absent"));
  }
  refuse_variants(c, path);
  const auto is_integer = [](const nlohmann::json& j) { return j.is_number_integer(); };
  const nlohmann::json* rank = peft_field(c, "r", is_integer, "an integer", path);
  const int64_t r = rank ? rank->get<int64_t>() : 0;
  if (r != l.rank) fail(fmt::format("r is {} but model.lora_rank is {}", r, l.rank));
  std::vector<std::string> targets = peft_targets(c, path);
  std::vector<std::string> mine = l.targets;
  std::sort(targets.begin(), targets.end());
  std::sort(mine.begin(), mine.end());
  if (targets != mine) {
    fail(fmt::format("target_modules [{}] differ from model.lora_targets [{}]",
                     fmt::join(targets, ", "), fmt::join(mine, ", ")));
  }
  const auto is_number = [](const nlohmann::json& j) { return j.is_number(); };
  const nlohmann::json* a = peft_field(c, "lora_alpha", is_number, "a number", path);
  const double alpha = a ? a->get<double>() : 8.0;
  if (std::abs(alpha - l.alpha) > 1e-9 * std::max(1.0, std::abs(alpha))) {
    fail(fmt::format("lora_alpha is {} but model.lora_alpha is {}", alpha, l.alpha));
  }
  const auto rslora = c.find("use_rslora");
  const bool theirs = rslora != c.end() && rslora->is_boolean() && rslora->get<bool>();
  if (theirs != l.rslora) {
    fail(fmt::format("use_rslora is {} but model.lora_rslora is {} (the adapters' scale: alpha / "
                     "{})",
                     theirs, l.rslora, theirs ? "sqrt(r)" : "r"));
  }
}

}  // namespace

void check_peft_config(const LoraOptions& options, const std::string& config_path) {
  check_peft_config(options, read_peft_config(config_path), config_path);
}

namespace {

// Each of `model`'s parameters (its adapters) by name: the PEFT adapter's tensor in DIR, float32,
// after every check of load_peft.
std::map<std::string, at::Tensor> peft_tensors(const CausalLm& model, const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / kPeftConfig).string();
  const std::string weights_path = (std::filesystem::path(dir) / kPeftWeights).string();
  check_peft_config(model.lora_options(), config_path);
  std::map<std::string, at::Tensor> weights;
  try {
    weights = io::read_safetensors(weights_path);
  } catch (const io::SafetensorsError& e) {
    throw std::invalid_argument(fmt::format("model.lora_init_from: {}", e.what()));
  }
  std::set<std::string> used;
  std::map<std::string, at::Tensor> by_parameter;
  for (const auto& item : model.named_parameters()) {
    const std::string key = peft_key(model, item.key());
    auto it = weights.find(key);
    if (it == weights.end()) {
      throw std::invalid_argument(
          fmt::format("model.lora_init_from: {}: no tensor '{}'", weights_path, key));
    }
    if (it->second.sizes() != item.value().sizes()) {
      throw std::invalid_argument(fmt::format("model.lora_init_from: {}: {} is {}, the model's {}",
                                              weights_path, key, it->second.sizes(),
                                              item.value().sizes()));
    }
    used.insert(key);
    by_parameter.emplace(item.key(), it->second.to(at::kFloat).contiguous());
  }
  std::vector<std::string> extra;
  for (const auto& [key, w] : weights) {
    if (!used.count(key)) extra.push_back(key);
  }
  if (!extra.empty()) {
    throw std::invalid_argument(fmt::format("model.lora_init_from: {}: tensors the model's "
                                            "adapters do not have: {}",
                                            weights_path, fmt::join(extra, ", ")));
  }
  return by_parameter;
}

}  // namespace

void load_peft(CausalLm& model, const std::string& dir) {
  const std::map<std::string, at::Tensor> tensors = peft_tensors(model, dir);
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) item.value().copy_(tensors.at(item.key()));
}

std::string base_hash(const CausalLm& model, const std::string& init_from) {
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&crc](const std::string& text) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size()));
  };
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path config = fs::path(init_from) / "config.json";
  if (!init_from.empty() && fs::is_regular_file(config, ec)) {
    std::ifstream in(config, std::ios::binary);
    add(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  }
  std::map<std::string, at::Tensor> frozen;  // by name: the order of the hash
  for (const auto& item : model.named_buffers()) frozen.emplace(item.key(), item.value());
  for (const std::string& name : model.frozen_buffer_names()) {
    const at::Tensor& t = frozen.at(name);
    add(fmt::format("{} {} {};", name, t.sizes(), c10::toString(t.scalar_type())));
  }
  return fmt::format("crc32:{:08x}", static_cast<uint32_t>(crc));
}

std::shared_ptr<CausalLm> with_lora(std::shared_ptr<CausalLm> model, const ModelOptions& options) {
  const LoraOptions lora = lora_options(options);
  if (lora.rank == 0) return model;
  model->add_lora(lora);
  model->set_base(options.init_from, base_hash(*model, options.init_from));
  if (!options.lora_init_from.empty()) {
    if (DeferredInit* scope = DeferredInit::current()) {
      // Built without storage (ddp.shard: parameters, --dry-run): checked now, read into each
      // rank's blocks of the adapters when the Trainer fills them (train/model_state.h).
      auto tensors = std::make_shared<const std::map<std::string, at::Tensor>>(
          peft_tensors(*model, options.lora_init_from));
      scope->record().read_adapters = [tensors](const std::string& name, int64_t first,
                                                const at::Tensor& out) {
        out.copy_(tensors->at(name).view({-1}).narrow(0, first, out.numel()));
      };
    } else {
      load_peft(*model, options.lora_init_from);
    }
    spdlog::info("model.lora_init_from: the adapters of {}", options.lora_init_from);
  }
  const LoraOptions& l = model->lora_options();
  const int64_t trained = parameter_count(*model), frozen = buffer_count(*model);
  spdlog::info("model.lora: rank {}, alpha {} ({}scale {}), dropout {}, on {} ({} layers): {} "
               "parameters train, {} frozen ({:.3f}% train)",
               l.rank, l.alpha, l.rslora ? "rsLoRA: alpha / sqrt(rank), " : "", lora_scale(l),
               l.dropout, fmt::join(l.targets, ", "), model->lora_sites().size(), trained, frozen,
               100.0 * static_cast<double>(trained) / static_cast<double>(trained + frozen));
  return model;
}

}  // namespace models
