// The schema: every config key, declared once with its type, default, range and a one-line
// description. It is the single source of defaults (the options structs' initialisers are only
// zero values), and --help-config and --print-config are printed from it.
//
// The keys of each section are declared in the file of the layer whose options struct holds
// them: schema_model.cpp, schema_data.cpp, schema_train.cpp (train, checkpoint, log),
// schema_ddp.cpp, schema_memory.cpp; with the builders of config/key_builders.h.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/run_config.h"

namespace config::schema {

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

// The keys of each section, in the order of the reference table and --print-config (internal to
// src/config/: keys() joins them); each is declared in the file of the layer whose options struct
// holds the section, with the builders of config/key_builders.h.
std::vector<KeyDef> model_keys();       // schema_model.cpp (models::ModelOptions)
std::vector<KeyDef> data_keys();        // schema_data.cpp (data::DataOptions)
std::vector<KeyDef> train_keys();       // schema_train.cpp (train::TrainOptions)
std::vector<KeyDef> ddp_keys();         // schema_ddp.cpp (ddp::DdpOptions)
std::vector<KeyDef> memory_keys();      // schema_memory.cpp (memory::MemoryOptions)
std::vector<KeyDef> eval_keys();        // schema_train.cpp (train::TrainOptions::eval_tasks)
std::vector<KeyDef> checkpoint_keys();  // schema_train.cpp (checkpoint::CheckpointOptions)
std::vector<KeyDef> log_keys();         // schema_train.cpp (train::LogOptions)

}  // namespace config::schema
