// The builders the schema declares its keys with, one per kind of value (an integer, a real, a
// boolean, a string, a choice, a list, ...), and the per-section declarations they serve. Each
// builder returns a KeyDef (config/schema.h) with its type and range for --help-config, a setter
// that parses and checks a YAML value, and a getter that writes the value back (--print-config).
// The section functions they serve (model_keys(), ...) are declared in config/schema.h.
//
// Internal to src/config/: included by the section files schema_<layer>.cpp only (it defines the
// FIELD macro they use).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/schema.h"

namespace config::schema {

// Accessors name a field of Config; `const_cast` lets one accessor serve get and set.
template <class T>
using Access = T& (*)(Config&);

// FIELD(section.key): the accessor of that field of Config.
// (clang-format 14 would write `Config & c` here.)
// clang-format off
#define FIELD(member) [](Config& c) -> auto& { return c.member; }
// clang-format on

inline constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A YAML scalar as an integer or a finite number; ValueError saying what was expected.
int64_t parse_int(const YAML::Node& node);
double parse_real(const YAML::Node& node);

// `k` with defaults of its own for some models (KeyDef::model_defaults: model.name -> YAML text).
KeyDef for_models(KeyDef k, std::vector<std::pair<std::string, std::string>> defaults);

// An integer in [lo, hi]; required when `def` is empty.
KeyDef integer(std::string path, Access<int64_t> access, std::string def, int64_t lo, int64_t hi,
               std::string description);

// A seed: an integer in [0, 2^63 - 1].
KeyDef seed(std::string path, Access<uint64_t> access, std::string def, std::string description);

// A real number in [lo, hi], or (lo, hi] with `lo_open`, or [lo, hi) with `hi_open`.
KeyDef real(std::string path, Access<double> access, std::string def, double lo, double hi,
            bool lo_open, bool hi_open, std::string description);

KeyDef boolean(std::string path, Access<bool> access, std::string def, std::string description);

// A string, written back quoted where YAML needs it (spaces, '#', ':', '~', ...).
KeyDef text(std::string path, Access<std::string> access, std::string def, std::string description);

// A string checked by `validate` (which throws std::invalid_argument with the reason).
KeyDef checked_text(std::string path, Access<std::string> access, std::string description,
                    std::function<void(const std::string&)> validate);

// A list of strings, e.g. [temperature, load]; [] is allowed.
KeyDef text_list(std::string path, Access<std::vector<std::string>> access, std::string def,
                 std::string description);

// A real number in [lo, hi], or `auto` (stored as -1).
KeyDef real_or_auto(std::string path, Access<double> access, std::string def, double lo, double hi,
                    std::string description);

// A positive integer, or `auto` (stored as 0).
KeyDef integer_or_auto(std::string path, Access<int64_t> access, std::string def,
                       std::string description);

// A choice kept as a string: a name from an open set (a registry's models, datasets, presets),
// which the registry looks up once, or a launcher key read once at start-up (train.device,
// ddp.backend, log.level). Required when `def` is empty.
KeyDef choice(std::string path, Access<std::string> access, std::string def,
              std::vector<std::string> options, std::string description);

// How a YAML value reads in a message: "'text'", "a list", "a mapping", "no value".
std::string kind_of(const YAML::Node& node);

// The position of `node`'s value among `options`; a ValueError naming them otherwise.
size_t choice_index(const YAML::Node& node, const std::vector<std::string>& options);

// The enum type a FIELD accessor names.
template <class Get>
using FieldType = std::remove_cvref_t<std::invoke_result_t<Get, Config&>>;

// A closed choice, stored as an enum whose value indexes `names` (the names the option struct
// declares beside the enum): parsed here once, printed back by name.
template <class Get, size_t N>
KeyDef enum_choice(std::string path, Get access, std::string def,
                   const std::array<const char*, N>& names, std::string description) {
  using E = FieldType<Get>;
  const std::vector<std::string> options(names.begin(), names.end());
  return {
      std::move(path),
      "choice",
      std::move(def),
      fmt::format("{}", fmt::join(options, " | ")),
      std::move(description),
      false,
      [=](Config& c, const YAML::Node& n) { access(c) = static_cast<E>(choice_index(n, options)); },
      [=](const Config& c) {
        return options.at(static_cast<size_t>(access(const_cast<Config&>(c))));
      }};
}

// A list of closed choices, e.g. [halve_micro_batch, uncache_embeddings], stored as enums like
// enum_choice's; [] is allowed.
template <class Get, size_t N>
KeyDef enum_list(std::string path, Get access, std::string def,
                 const std::array<const char*, N>& names, std::string description) {
  using E = typename FieldType<Get>::value_type;
  const std::vector<std::string> options(names.begin(), names.end());
  return {std::move(path),
          "list",
          std::move(def),
          fmt::format("of: {}", fmt::join(options, ", ")),
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            if (!n.IsSequence()) {
              throw ValueError(
                  fmt::format("expected a list like [{}], got {}", options[0], kind_of(n)));
            }
            std::vector<E> values;
            for (const auto& item : n) {
              values.push_back(static_cast<E>(choice_index(item, options)));
            }
            access(c) = std::move(values);
          },
          [=](const Config& c) {
            std::vector<std::string> chosen;
            for (const E v : access(const_cast<Config&>(c))) {
              chosen.push_back(options.at(static_cast<size_t>(v)));
            }
            return fmt::format("[{}]", fmt::join(chosen, ", "));
          }};
}

}  // namespace config::schema
