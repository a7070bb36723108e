// Loading the YAML run configuration into Config (config/run_config.h), validated, and writing it
// back.
//
// Every key is declared once, with type, default, range and description, in the schema
// (config/schema.h).
// Unknown keys, wrong types, out-of-range and missing required values are ConfigErrors whose
// message names the key path and file:line (or the --set that caused it).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "config/run_config.h"

namespace config {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads `path`, applies `overrides` ("section.key=value", in order), validates.
// Throws ConfigError listing every problem found, one per line.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Parses YAML text as if it came from `source_name` (for tests and --set-only runs).
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The effective configuration as YAML, every key included.
std::string config_to_yaml(const Config& config);

// A table of every key: path, type, default, range, description.
std::string config_reference();

}  // namespace config
