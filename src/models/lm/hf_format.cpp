#include "models/lm/hf_format.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "io/safetensors.h"
#include "io/safetensors_shards.h"

namespace models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

}  // namespace

std::string shape_text(const at::Tensor& t) { return fmt::format("{}", t.sizes()); }

std::invalid_argument init_error(const std::string& what) {
  return std::invalid_argument("model.init_from: " + what);
}

HfConfig HfConfig::read(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw init_error(fmt::format("{}: cannot be read", file));
  json c;
  try {
    c = json::parse(in);
  } catch (const json::exception& e) {
    throw init_error(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  if (!c.is_object()) throw init_error(fmt::format("{}: not a JSON object", file));
  return HfConfig(std::move(c), file);
}

HfConfig::HfConfig(json config, std::string file)
    : config_(std::move(config)), file_(std::move(file)) {}

std::invalid_argument HfConfig::bad(const std::string& key, const std::string& why) const {
  const json* v = find(key);
  return init_error(fmt::format("{}: {} = {}: {}", file_, key, v ? v->dump() : "(absent)", why));
}

const json* HfConfig::find(const std::string& key) const {
  return config_.contains(key) && !config_[key].is_null() ? &config_[key] : nullptr;
}

int64_t HfConfig::integer(const std::string& key) const {
  if (find(key) == nullptr) throw bad(key, "missing; the model's config.json has it");
  return integer_or(key, 0);
}

bool HfConfig::has(const std::string& key) const { return config_.contains(key); }

int64_t HfConfig::integer_or(const std::string& key, int64_t fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number_integer() || v->get<int64_t>() <= 0) throw bad(key, "not a positive integer");
  return v->get<int64_t>();
}

double HfConfig::number(const std::string& key, double fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number()) throw bad(key, "not a number");
  return v->get<double>();
}

bool HfConfig::flag(const std::string& key, bool fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) throw bad(key, "not true or false");
  return v->get<bool>();
}

std::string HfFiles::where() const { return fmt::format("{}", fmt::join(files, ", ")); }

HfFiles find_hf_files(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) {
    throw init_error(fmt::format("{}: no such file or directory", path));
  }
  HfFiles found;
  if (fs::is_directory(path, ec)) {
    found.dir = path;
    found.files = io::safetensors_files(path);
    if (found.files.empty()) {
      throw init_error(fmt::format("{}: the directory holds neither {} nor {} ({})", path,
                                   io::kSafetensorsFile, io::kSafetensorsIndex, what));
    }
  } else {
    found.files = {path};
  }
  const fs::path beside = fs::path(found.files.front()).parent_path() / "config.json";
  if (fs::exists(beside, ec)) found.config_file = beside.string();
  return found;
}

std::map<std::string, at::Tensor> read_hf_tensors(const HfFiles& files) {
  try {
    return files.dir.empty() ? io::read_safetensors(files.files.front())
                             : io::read_safetensors_dir(files.dir);
  } catch (const io::SafetensorsError& e) {
    throw init_error(e.what());
  }
}

void load_hf_weights(const std::map<std::string, at::Tensor>& weights, torch::nn::Module& model,
                     const HfLoad& how) {
  const auto vocab_rows = [&](const std::string& name) {
    return std::find(how.vocab_rows.begin(), how.vocab_rows.end(), name) != how.vocab_rows.end();
  };
  std::set<std::string> used;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // checked first, then copied
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& mine = item.value();
    auto it = weights.find(name);
    if (it == weights.end()) {
      throw init_error(fmt::format("{}: no tensor '{}' for the model's {} {} ({})", how.where,
                                   how.file_name ? how.file_name(name) : name, name,
                                   shape_text(mine), how.config));
    }
    used.insert(name);
    const at::Tensor& w = it->second;
    // The file has the real vocabulary's rows; the model's are padded.
    const bool unpadded = vocab_rows(name) && w.dim() == 2 && w.size(0) == how.vocab_size &&
                          w.size(1) == mine.size(1);
    if (!unpadded && w.sizes() != mine.sizes()) {
      throw init_error(fmt::format("{}: {} has shape {}{} but the model's is {} ({})", how.where,
                                   name, shape_text(w), how.shape_note ? how.shape_note(name) : "",
                                   shape_text(mine), how.config));
    }
    copies.emplace_back(mine, w);
  }
  std::vector<std::string> extra;
  for (const auto& [name, w] : weights) {
    if (!used.count(name)) extra.push_back(name);
  }
  if (!extra.empty()) {
    throw init_error(fmt::format("{}: tensors the model ({}) does not have: {}", how.where,
                                 how.config, fmt::join(extra, ", ")));
  }
  at::NoGradGuard no_grad;
  for (auto& [mine, w] : copies) {
    mine.narrow(0, 0, w.size(0)).copy_(w);
    if (w.size(0) < mine.size(0)) mine.narrow(0, w.size(0), mine.size(0) - w.size(0)).zero_();
  }
}

std::vector<std::string> write_hf_dir(const std::string& dir, const std::string& config_json,
                                      const std::map<std::string, at::Tensor>& tensors,
                                      int64_t max_shard_bytes) {
  std::vector<io::TensorEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  return write_hf_dir(
      dir, config_json, std::move(entries),
      [&](const io::TensorEntry& e) { return tensors.at(e.name); }, max_shard_bytes);
}

std::vector<std::string> write_hf_dir(
    const std::string& dir, const std::string& config_json, std::vector<io::TensorEntry> entries,
    const std::function<at::Tensor(const io::TensorEntry&)>& produce, int64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(fmt::format("cannot create the directory {}: {}", dir, ec.message()));
  }
  const std::string config = (fs::path(dir) / "config.json").string();
  std::ofstream out(config);
  out << config_json;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", config));
  try {
    // transformers reads the "format" metadata of a safetensors file to know its framework.
    return io::write_safetensors_dir(dir, std::move(entries), produce, max_shard_bytes,
                                     {{"format", "pt"}});
  } catch (const io::SafetensorsError& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace models
