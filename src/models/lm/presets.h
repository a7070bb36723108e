// The preset lookup of the language-model families (gpt_preset, llama_preset): a family keeps a
// table of structs with a `name` and its dimensions; these find an entry by model.preset.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace models {

// The names of a preset table (an array or a vector), in its order.
template <class Table>
std::vector<std::string> preset_names_of(const Table& table) {
  std::vector<std::string> names;
  for (const auto& p : table) names.emplace_back(p.name);
  return names;
}
// The entry named `name`, or std::invalid_argument naming model.preset and the family's presets.
template <class Table>
const auto& find_preset(const Table& table, const std::string& name, const std::string& family) {
  for (const auto& p : table) {
    if (name == p.name) return p;
  }
  throw std::invalid_argument(
      fmt::format("model.preset: unknown {} preset '{}'; known {} presets: {}", family, name,
                  family, fmt::join(preset_names_of(table), ", ")));
}

}  // namespace models
