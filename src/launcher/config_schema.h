// The declaration of every config key (internal to the launcher's config loading).
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config.h"

namespace launcher::schema {

// Thrown by a key's setter when a value is wrong; config.cpp adds the key and location.
class ValueError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct KeyDef {
  std::string path;          // "section.key"
  std::string type;          // for the reference table
  std::string default_text;  // empty when required
  std::string range;         // for the reference table
  std::string description;
  bool required = false;
  // Parses and validates `node`, stores it in the config; throws ValueError.
  std::function<void(Config&, const YAML::Node&)> set;
  // The current value as YAML text.
  std::function<std::string(const Config&)> get;
  // A model's own default for this key (model.name -> YAML text), used in place of
  // default_text when the config names that model and does not set the key.
  std::vector<std::pair<std::string, std::string>> model_defaults{};
};

// Every key, in the order of the reference table and --print-config.
const std::vector<KeyDef>& keys();

// Sections in order.
std::vector<std::string> sections();

}  // namespace launcher::schema
