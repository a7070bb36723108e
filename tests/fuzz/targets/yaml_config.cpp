// A YAML run configuration and --set strings through parse_config (load_config reads the file
// and calls it): the YAML, the schema's keys and checks, the overrides. The input is the YAML,
// then up to four --set strings, cut at fuzz::kSeparator. A configuration that parses is written
// back as the effective YAML (config_to_yaml: what a run records beside its checkpoints) and
// that must parse to the same configuration. Typed error: config::ConfigError.
#include "config/config.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(yaml_config) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 5);
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  std::string effective;
  try {
    effective =
        config::config_to_yaml(config::parse_config(std::string(parts[0]), "fuzz.yaml", overrides));
  } catch (const config::ConfigError&) {
    return 0;
  }
  if (config::config_to_yaml(config::parse_config(effective, "effective.yaml")) != effective) {
    abort();  // the effective configuration does not read back as itself
  }
  return 0;
}
