#include "config/schema.h"

#include <algorithm>

namespace config::schema {

const std::vector<KeyDef>& keys() {
  static const std::vector<KeyDef> table = [] {
    std::vector<KeyDef> all;
    for (const auto& section : {model_keys(), data_keys(), train_keys(), eval_keys(), ddp_keys(),
                                memory_keys(), checkpoint_keys(), log_keys()}) {
      all.insert(all.end(), section.begin(), section.end());
    }
    return all;
  }();
  return table;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const auto& k : keys()) {
    std::string section = k.path.substr(0, k.path.find('.'));
    if (std::find(out.begin(), out.end(), section) == out.end()) out.push_back(section);
  }
  return out;
}

}  // namespace config::schema
