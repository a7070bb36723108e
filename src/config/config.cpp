#include "config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "config/schema.h"

namespace config {
namespace {

using schema::KeyDef;

const KeyDef* find_key(const std::string& path) {
  for (const auto& k : schema::keys()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 4;  // more than 3 edits away is no longer a typo
  for (const auto& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", *best) : std::string();
}

std::vector<std::string> key_paths() {
  std::vector<std::string> paths;
  for (const auto& k : schema::keys()) paths.push_back(k.path);
  return paths;
}

// Reads one configuration into a Config: the schema's defaults, the YAML document, the --set
// overrides, the model's own defaults, then the checks. Collects problems with their locations;
// thrown together as one ConfigError. (Not "Loader": data::Loader is the batch loader.)
class ConfigReader {
 public:
  explicit ConfigReader(std::string source) : source_(std::move(source)) {}

  std::string where(const YAML::Mark& mark) const {
    return mark.is_null() ? source_ : fmt::format("{}:{}", source_, mark.line + 1);
  }

  void error(const std::string& location, const std::string& message) {
    errors_.push_back(fmt::format("{}: {}", location, message));
  }

  void apply(Config& config, const KeyDef& key, const YAML::Node& value,
             const std::string& location) {
    origin_[key.path] = location;  // given, even if the value is rejected below
    try {
      key.set(config, value);
    } catch (const schema::ValueError& e) {
      rejected_.insert(key.path);
      error(location, fmt::format("{}: {}", key.path, e.what()));
    }
  }

  void apply_document(Config& config, const YAML::Node& root) {
    if (root.IsNull()) return;  // an empty file: only defaults (required keys are reported)
    if (!root.IsMap()) {
      error(where(root.Mark()),
            "the top level must be a mapping of sections (model:, data:, train:, ...)");
      return;
    }
    const auto known_sections = schema::sections();
    for (const auto& section : root) {
      const std::string at = where(section.first.Mark());
      if (!section.first.IsScalar()) {
        error(at, "a section name must be a plain word (model, data, train, ...)");
        continue;
      }
      const std::string name = section.first.Scalar();
      if (std::find(known_sections.begin(), known_sections.end(), name) == known_sections.end()) {
        error(at, fmt::format("unknown section '{}'{}; sections are: {}", name,
                              suggestion(name, known_sections), fmt::join(known_sections, ", ")));
        continue;
      }
      if (section.second.IsNull()) continue;
      if (!section.second.IsMap()) {
        error(at, fmt::format("section '{}' must be a mapping of keys", name));
        continue;
      }
      for (const auto& entry : section.second) {
        const std::string key_at = where(entry.first.Mark());
        if (!entry.first.IsScalar()) {
          error(key_at, fmt::format("a key in section '{}' must be a plain name", name));
          continue;
        }
        const std::string path = name + "." + entry.first.Scalar();
        if (const KeyDef* key = find_key(path)) {
          if (origin_.count(path) && origin_[path] != "default") {
            error(key_at, fmt::format("{}: given twice (first at {})", path, origin_[path]));
            continue;
          }
          apply(config, *key, entry.second, key_at);
        } else {
          error(key_at, fmt::format("unknown key '{}'{}", path, suggestion(path, key_paths())));
        }
      }
    }
  }

  void apply_override(Config& config, const std::string& text) {
    const std::string location = fmt::format("--set {}", text);
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      error(location, "expected --set section.key=value");
      return;
    }
    const std::string path = text.substr(0, eq);
    const KeyDef* key = find_key(path);
    if (key == nullptr) {
      error(location, fmt::format("unknown key '{}'{}", path, suggestion(path, key_paths())));
      return;
    }
    YAML::Node value;
    try {
      value = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      error(location, fmt::format("{}: cannot parse the value: {}", path, e.msg));
      return;
    }
    apply(config, *key, value, location);
  }

  void check_required(const std::string& file_location) {
    for (const auto& k : schema::keys()) {
      if (k.required && origin_[k.path].empty()) {
        error(file_location,
              fmt::format("{}: required, but not given (add it to the '{}' section or pass "
                          "--set {}=...)",
                          k.path, k.path.substr(0, k.path.find('.')), k.path));
      }
    }
  }

  // Rules between keys, reported where the user wrote one of them.
  // data.mixture beside the other data keys, and its folders.
  void check_mixture(const Config& c) {
    const std::string at = origin_["data.mixture"];
    if (c.data.dataset != "tokens") {
      error(at, fmt::format("data.mixture: sources of token shards need data.dataset: tokens (it "
                            "is {})",
                            c.data.dataset));
    }
    for (const auto& [key, value] :
         {std::pair{"data.path", &c.data.path}, std::pair{"data.val_path", &c.data.val_path}}) {
      if (!value->empty()) {
        error(origin_[key], fmt::format("{}: not with data.mixture, whose sources each name their "
                                        "folder (validation shards: the *val* files in it); "
                                        "leave it empty (--set {}=)",
                                        key, key));
      }
    }
    for (size_t i = 0; i < c.data.mixture.size(); ++i) {
      std::error_code ec;
      const std::string& path = c.data.mixture[i].path;
      if (!std::filesystem::is_directory(path, ec)) {
        error(at, fmt::format(
                      "data.mixture: [{}].path: {}: {}", i, path,
                      std::filesystem::exists(path, ec) ? "not a directory" : "no such directory"));
      }
    }
  }

  void check_relations(const Config& c) {
    auto given = [&](const char* key) { return !rejected_.count(key); };
    auto at = [&](const char* key) {
      return origin_[key] == "default" ? source_ + " (default)" : origin_[key];
    };
    if (c.model.name == "recommender" && given("model.encoder_dim") &&
        given("model.encoder_heads") && c.model.encoder_dim % c.model.encoder_heads != 0) {
      error(at("model.encoder_heads"),
            fmt::format("model.encoder_heads = {} must divide model.encoder_dim = {}",
                        c.model.encoder_heads, c.model.encoder_dim));
    }
    if (c.data.dataset == "movielens" && c.data.path.empty() && given("data.path")) {
      error(at("data.dataset"), "data.path: required when data.dataset is movielens (a directory "
                                "holding ratings.dat and movies.dat; scripts/make_movielens.py "
                                "writes one)");
    }
    if (!c.data.mixture.empty() && given("data.mixture")) check_mixture(c);
    if (c.checkpoint.resume == "auto" && c.checkpoint.dir.empty() && given("checkpoint.resume")) {
      error(at("checkpoint.resume"), "checkpoint.resume: 'auto' looks for the latest checkpoint in "
                                     "checkpoint.dir, which is not set");
    }
    // Muon orthogonalises the update of the hidden layers' full weight matrices, which LoRA
    // freezes (models/lm/lora.h); its factors A and B are rank-r and stay with AdamW's rule.
    if (c.train.optimizer == train::OptimizerKind::kMuon && c.model.has_adapters() &&
        given("train.optimizer") && given("model.lora_rank")) {
      error(at("train.optimizer"),
            fmt::format("train.optimizer: muon updates the hidden layers' weight matrices, which "
                        "model.lora_rank = {} freezes (only the adapters train); use "
                        "train.optimizer: adamw with LoRA, or set model.lora_rank: 0",
                        c.model.lora_rank));
    }
    if (c.ddp.shard_group == ddp::ShardGroup::kNode && c.ddp.shard == ddp::ShardMode::kNone &&
        given("ddp.shard_group") && given("ddp.shard")) {
      error(at("ddp.shard_group"),
            "ddp.shard_group: 'node' shards within each node, but ddp.shard is none (set ddp.shard "
            "to optimizer, gradients or parameters, or ddp.shard_group to world)");
    }
    // A rule between keys only means something when both values were accepted.
    if (rejected_.count("train.warmup_steps") || rejected_.count("train.steps")) return;
    if (c.train.warmup_steps >= c.train.steps && c.train.steps > 1) {
      const bool warmup_given = origin_["train.warmup_steps"] != "default";
      error(warmup_given ? origin_["train.warmup_steps"] : origin_["train.steps"],
            fmt::format("train.warmup_steps{} = {} must be smaller than train.steps = {}",
                        warmup_given ? "" : " (default)", c.train.warmup_steps, c.train.steps));
    }
  }

  void set_defaults(Config& config) {
    for (const auto& k : schema::keys()) {
      if (k.required) continue;
      k.set(config, YAML::Load(k.default_text));  // defaults are YAML, like the user's values
      origin_[k.path] = "default";
    }
  }

  // After every value is in: the keys left at their default take the named model's own default
  // where the schema gives one (KeyDef::model_defaults).
  void set_model_defaults(Config& config) {
    for (const auto& k : schema::keys()) {
      if (origin_[k.path] != "default") continue;
      for (const auto& [model, text] : k.model_defaults) {
        if (model == config.model.name) k.set(config, YAML::Load(text));
      }
    }
  }

  void throw_if_errors() const {
    if (errors_.empty()) return;
    std::string message = fmt::format("{}", fmt::join(errors_, "\n"));
    if (errors_.size() > 1) {
      message = fmt::format("{} problems in the configuration:\n{}", errors_.size(), message);
    }
    throw ConfigError(message);
  }

 private:
  std::string source_;
  std::vector<std::string> errors_;
  std::map<std::string, std::string> origin_;  // key path -> where its value came from
  std::set<std::string> rejected_;             // keys given a value that was rejected
};

Config build(const YAML::Node& root, const std::string& source,
             const std::vector<std::string>& overrides) {
  Config config;
  config.source = source;
  ConfigReader reader(source);
  reader.set_defaults(config);
  reader.apply_document(config, root);
  for (const auto& o : overrides) reader.apply_override(config, o);
  reader.set_model_defaults(config);
  reader.check_required(source);
  reader.check_relations(config);
  reader.throw_if_errors();
  // The data layer reads preference pairs for a preference objective (data/token_shards.h).
  if (config.train.objective != train::ObjectiveKind::kLm) {
    config.data.preference = train::kObjectiveNames[static_cast<size_t>(config.train.objective)];
  }
  return config;
}

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}: not valid YAML: {}", source, e.mark.line + 1, e.msg));
  }
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  return build(parse_yaml(yaml_text, source_name), source_name, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(
        fmt::format("{}: cannot read the config file: {}", path, std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

std::string config_to_yaml(const Config& config) {
  std::string out;
  std::string current;
  for (const auto& k : schema::keys()) {
    const auto dot = k.path.find('.');
    const std::string section = k.path.substr(0, dot);
    if (section != current) {
      out += fmt::format("{}{}:\n", current.empty() ? "" : "\n", section);
      current = section;
    }
    out += fmt::format("  {}: {}\n", k.path.substr(dot + 1), k.get(config));
  }
  return out;
}

std::string config_reference() {
  size_t w_path = 3, w_type = 4, w_def = 7, w_range = 5;
  for (const auto& k : schema::keys()) {
    w_path = std::max(w_path, k.path.size());
    w_type = std::max(w_type, k.type.size());
    w_def = std::max(w_def, k.required ? 8 : k.default_text.size());
    w_range = std::max(w_range, k.range.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", "key", w_path, "type",
                                w_type, "default", w_def, "range", w_range, "description");
  for (const auto& k : schema::keys()) {
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", k.path, w_path, k.type, w_type,
                       k.required ? "required" : k.default_text, w_def, k.range, w_range,
                       k.description);
  }
  return out;
}

}  // namespace config
