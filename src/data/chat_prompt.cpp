#include "data/chat_prompt.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/errors.h"
#include "data/mapped_file.h"

namespace data {
namespace {

std::vector<int64_t> ids_at(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto bad = [&](const std::string& why) {
    return DataError(fmt::format("{}: \"{}\": {}", path, key, why));
  };
  if (!j.contains(key) || !j.at(key).is_array()) throw bad("missing, or not a list of token ids");
  std::vector<int64_t> ids;
  for (const auto& v : j.at(key)) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      throw bad(fmt::format("{} is not a token id", v.dump()));
    }
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

}  // namespace

ChatPrompt read_chat_prompt(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot be read", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not JSON ({})", path, e.what()));
  }
  if (!j.is_object() || j.value("format", std::string()) != "trainer-chat-prompt" ||
      !j.contains("version") || j.at("version") != 1) {
    throw DataError(
        fmt::format("{}: not a chat prompt of format \"trainer-chat-prompt\" version 1 (scripts/"
                    "tokenize_text.py --chat writes one beside its shards)",
                    path));
  }
  ChatPrompt c;
  c.path = path;
  c.before_ids = ids_at(j, "before_ids", path);
  c.after_ids = ids_at(j, "after_ids", path);
  c.stop_ids = ids_at(j, "stop_ids", path);
  if (c.stop_ids.empty()) {
    throw DataError(fmt::format("{}: \"stop_ids\": empty: a reply would never end", path));
  }
  if (j.contains("tokenizer") && j.at("tokenizer").is_string()) {
    c.tokenizer = j.at("tokenizer").get<std::string>();
  }
  // "template": the --chat-template file's path, or "the tokenizer's" (scripts/tokenize_text.py).
  if (j.contains("template") && j.at("template").is_string() &&
      j.at("template").get<std::string>().starts_with("/")) {
    c.template_file = j.at("template").get<std::string>();
  }
  return c;
}

std::string find_chat_prompt(const std::string& data_path, const std::string& init_from) {
  for (const std::string& where : {data_path, init_from}) {
    if (where.empty()) continue;
    const std::string candidate = folder_of(where) + "/" + kChatPromptName;
    if (is_regular_file(candidate)) return candidate;
  }
  return {};
}

std::vector<int64_t> chat_prompt_ids(const ChatPrompt& chat, const std::vector<int64_t>& question) {
  std::vector<int64_t> ids = chat.before_ids;
  ids.insert(ids.end(), question.begin(), question.end());
  ids.insert(ids.end(), chat.after_ids.begin(), chat.after_ids.end());
  return ids;
}

}  // namespace data
