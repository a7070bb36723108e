#include "launcher/no_data.h"

#include <fmt/format.h>

#include <sys/stat.h>

namespace launcher {

std::string missing_validation_data(const config::Config& config, bool evaluating) {
  const data::DataOptions& d = config.data;
  if (!evaluating || config.train.eval_tasks.empty() || d.dataset != "tokens") return "";
  if (d.path.empty()) return "data.path is not set";
  struct stat info {};
  if (::stat(d.path.c_str(), &info) != 0)
    return fmt::format("data.path '{}' does not exist", d.path);
  return "";
}

core::Shape shape_without_data(const config::Config& config) {
  core::Shape shape;
  shape.vocab_size = config.data.vocab_size;
  shape.context = config.data.context;
  return shape;
}

std::string without_data_hint(const config::Config& config) {
  return fmt::format(
      "; without data the model is built for data.vocab_size = {} token ids and data.context = "
      "{}: set them as the run that wrote the checkpoint had them",
      config.data.vocab_size, config.data.context);
}

}  // namespace launcher
