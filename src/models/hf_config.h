// What the Hugging Face importers (gpt/hf_gpt2.cpp, llama/hf_llama.cpp) share: the error type
// that names model.init_from, and reading a config.json into a JSON object.
#pragma once

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace models {

// A user mistake in the weights model.init_from names: exit 2, naming the key.
inline std::invalid_argument init_error(const std::string& what) {
  return std::invalid_argument("model.init_from: " + what);
}

// `file` parsed as one JSON object; otherwise an init_error naming the file and what is wrong.
inline nlohmann::json read_hf_config(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw init_error(fmt::format("{}: cannot be read", file));
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw init_error(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  if (!c.is_object()) throw init_error(fmt::format("{}: not a JSON object", file));
  return c;
}

}  // namespace models
