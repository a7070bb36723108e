#include "launcher/serving_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "data/chat_prompt.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "models/lm/hf_ranges.h"

namespace launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What save_pretrained of a tokenizer writes (transformers 4 and 5), and a SentencePiece model.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "tokenizer.model",
                                           "vocab.json",
                                           "merges.txt",
                                           "added_tokens.json",
                                           "chat_template.jinja",
                                           "chat_template.json"};

std::string path_in(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The folder a model.init_from names: itself, or the folder of the file it names.
std::string folder_of(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path;
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", path));
}

// A JSON file's object; nullopt when the file is missing or is not a JSON object.
std::optional<json> read_json_object(const std::string& path) {
  if (!is_file(path)) return std::nullopt;
  json j = json::parse(read_text(path), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

void write_json(const std::string& path, const json& j) { write_text(path, j.dump(2) + "\n"); }

// Copies `from` to `to` unless they are the same file (an export into model.init_from's folder).
void copy_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return;
  write_text(to, read_text(from));
}

// The tokenizer files of `tokenizer_json` into `dir`; returns the names written.
std::vector<std::string> copy_tokenizer(const std::string& tokenizer_json, const std::string& dir) {
  std::vector<std::string> written;
  if (fs::path(tokenizer_json).filename() != "tokenizer.json") {
    copy_file(tokenizer_json, path_in(dir, "tokenizer.json"));
    return {"tokenizer.json"};
  }
  const std::string from = fs::path(tokenizer_json).parent_path().string();
  for (const char* name : kTokenizerFiles) {
    const std::string source = path_in(from.empty() ? "." : from, name);
    if (!is_file(source)) continue;
    copy_file(source, path_in(dir, name));
    written.emplace_back(name);
  }
  return written;
}

// A special token of tokenizer_config.json ("<s>", or {"content": "<s>", ...}); "" when unset.
std::string token_text(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& t = config.at(key);
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t.at("content").is_string())
    return t.at("content").get<std::string>();
  return "";
}

// The id tokenizer.json gives a token's text (an added token, else the model's vocabulary).
std::optional<int64_t> token_id(const json& tokenizer, const std::string& text) {
  if (text.empty() || !tokenizer.is_object()) return std::nullopt;
  for (const json& added : tokenizer.value("added_tokens", json::array())) {
    if (!added.is_object()) continue;
    if (added.value("content", std::string()) == text && added.contains("id"))
      return added.at("id").get<int64_t>();
  }
  const json vocab =
      tokenizer.contains("model") ? tokenizer.at("model").value("vocab", json()) : json();
  if (vocab.is_object() && vocab.contains(text) && vocab.at(text).is_number_integer())
    return vocab.at(text).get<int64_t>();
  return std::nullopt;
}

// The text tokenizer.json gives an id among its added tokens; "" when none.
std::string added_token_text(const json& tokenizer, int64_t id) {
  if (!tokenizer.is_object()) return "";
  for (const json& added : tokenizer.value("added_tokens", json::array())) {
    if (added.is_object() && added.value("id", int64_t{-1}) == id)
      return added.value("content", std::string());
  }
  return "";
}

// The run's chat.json (data/chat_prompt.h), when it has one.
std::optional<data::ChatPrompt> run_chat_prompt(const config::Config& config) {
  const std::string path = data::find_chat_prompt(config.data.path, config.model.init_from);
  if (path.empty()) return std::nullopt;
  return data::read_chat_prompt(path);
}

// tokenizer_config.json in `dir`: the copied one, or a new one for the tokenizer.json there; the
// chat template of --chat-template (chat.json) in it, and in a copied chat_template.jinja, which
// transformers 5 reads first.
void finish_tokenizer_config(const config::Config& config, const std::string& dir,
                             std::vector<std::string>& written) {
  const std::string file = path_in(dir, "tokenizer_config.json");
  std::optional<json> tc = read_json_object(file);
  const bool copied = tc.has_value();
  if (!copied) {
    const json tokenizer = read_json_object(path_in(dir, "tokenizer.json")).value_or(json());
    const auto tok = data::choose_tokenizer(config.data, config.model.init_from);
    const std::string eos =
        tok->end_of_text() ? added_token_text(tokenizer, *tok->end_of_text()) : std::string();
    tc = json{{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", nullptr},
              {"eos_token", eos.empty() ? json(nullptr) : json(eos)},
              {"clean_up_tokenization_spaces", false}};
  }
  const auto chat = run_chat_prompt(config);
  if (chat && !chat->template_file.empty() && is_file(chat->template_file)) {
    const std::string text = read_text(chat->template_file);
    (*tc)["chat_template"] = text;
    const std::string jinja = path_in(dir, "chat_template.jinja");
    if (is_file(jinja)) write_text(jinja, text);
  } else if (copied) {
    return;
  }
  write_json(file, *tc);
  if (std::find(written.begin(), written.end(), "tokenizer_config.json") == written.end())
    written.emplace_back("tokenizer_config.json");
}

// The bos and eos ids the export declares: model.init_from's config.json's, else those of the
// tokenizer_config.json's tokens in `dir`, else what the family's exporter wrote in `written`
// (GPT-2's end of text).
std::pair<json, json> special_ids(const config::Config& config, const std::string& dir,
                                  const json& written) {
  json bos = nullptr, eos = nullptr;
  if (!config.model.init_from.empty()) {
    const auto base = read_json_object(path_in(folder_of(config.model.init_from), "config.json"));
    if (base) {
      bos = base->value("bos_token_id", json());
      eos = base->value("eos_token_id", json());
    }
  }
  const auto tc = read_json_object(path_in(dir, "tokenizer_config.json"));
  const auto tokenizer = read_json_object(path_in(dir, "tokenizer.json"));
  if (tc && tokenizer) {
    if (bos.is_null()) {
      if (const auto id = token_id(*tokenizer, token_text(*tc, "bos_token"))) bos = *id;
    }
    if (eos.is_null()) {
      if (const auto id = token_id(*tokenizer, token_text(*tc, "eos_token"))) eos = *id;
    }
  }
  if (bos.is_null()) bos = written.value("bos_token_id", json());
  if (eos.is_null()) eos = written.value("eos_token_id", json());
  return {bos, eos};
}

// The ids of `ids` (an id, a list of them, or null) and of `more`, each once, in order.
json id_list(const json& ids, const std::vector<int64_t>& more) {
  std::vector<int64_t> out;
  if (ids.is_number_integer()) out.push_back(ids.get<int64_t>());
  if (ids.is_array()) {
    for (const json& id : ids) {
      if (id.is_number_integer()) out.push_back(id.get<int64_t>());
    }
  }
  for (const int64_t id : more) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  if (out.empty()) return nullptr;
  return out.size() == 1 ? json(out.front()) : json(out);
}

}  // namespace

ServingFiles write_tokenizer_files(const config::Config& config, const std::string& dir) {
  ServingFiles out;
  std::string setting;
  try {
    setting = data::tokenizer_setting(config.data, config.model.init_from);
  } catch (const std::invalid_argument& e) {
    out.no_tokenizer = e.what();
    return out;
  }
  if (data::is_tokenizer_json_path(setting)) {
    if (!is_file(setting)) throw std::runtime_error(fmt::format("cannot read {}", setting));
    out.written = copy_tokenizer(setting, dir);
    out.tokenizer = setting;
  } else {
    std::string text;
    try {
      text = data::builtin_tokenizer_json(setting);
    } catch (const std::exception& e) {  // gpt2's ranks file not there: the weights still serve
      out.no_tokenizer = e.what();
      return out;
    }
    write_text(path_in(dir, "tokenizer.json"), text);
    out.written = {"tokenizer.json"};
    out.tokenizer = "data.tokenizer " + setting;
  }
  finish_tokenizer_config(config, dir, out.written);
  return out;
}

ServingFiles write_serving_files(const config::Config& config, const std::string& dir,
                                 at::ScalarType dtype) {
  ServingFiles out = write_tokenizer_files(config, dir);
  const std::string file = path_in(dir, "config.json");
  std::optional<json> c = read_json_object(file);
  if (!c) throw std::runtime_error(fmt::format("cannot read {} as JSON", file));
  const auto [bos, eos] = special_ids(config, dir, *c);
  std::vector<int64_t> stops;
  if (const auto chat = run_chat_prompt(config)) stops = chat->stop_ids;
  // generation_config.json: model.init_from's (its sampling defaults kept), or a new one.
  std::optional<json> generation;
  if (!config.model.init_from.empty()) {
    generation =
        read_json_object(path_in(folder_of(config.model.init_from), "generation_config.json"));
  }
  json g = generation.value_or(json::object());
  g.erase("_from_model_config");  // else transformers may rebuild it from config.json
  if (g.value("bos_token_id", json()).is_null()) g["bos_token_id"] = bos;
  g["eos_token_id"] =
      id_list(g.value("eos_token_id", json()).is_null() ? eos : g["eos_token_id"], stops);
  write_json(path_in(dir, "generation_config.json"), g);
  out.written.emplace_back("generation_config.json");
  // config.json, as the family's exporter wrote it, with the declared dtype and the special ids.
  (*c)["dtype"] = (*c)["torch_dtype"] = models::hf_dtype_name(dtype);
  (*c)["bos_token_id"] = bos;
  (*c)["eos_token_id"] = eos;
  write_json(file, *c);
  return out;
}

std::string peft_base_name(const std::string& init_from) {
  if (init_from.empty()) return "";
  const std::string folder = folder_of(init_from);
  if (const auto c = read_json_object(path_in(folder, "config.json"))) {
    const json recorded = c->value("_name_or_path", json());
    const std::string name = recorded.is_string() ? recorded.get<std::string>() : "";
    static const std::regex hub_id(R"([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)");
    std::error_code ec;
    const bool local = name == init_from || fs::exists(name, ec);
    if (std::regex_match(name, hub_id) && !local) return name;
  }
  std::error_code ec;
  const fs::path absolute = fs::absolute(init_from, ec);
  return ec ? init_from : absolute.lexically_normal().string();
}

}  // namespace launcher
