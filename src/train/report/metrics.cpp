#include "train/report/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace train {

MetricsFile::MetricsFile(const std::string& path, int64_t keep_through) : path_(path) {
  // Keep the records of steps up to the checkpoint; a line that is not JSON (a write cut short by
  // a kill) is dropped with them.
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded() || !record.is_object()) continue;
      const auto step = record.find("step");
      if (step != record.end() && step->is_number_integer() && step->get<int64_t>() > keep_through)
        continue;
      kept.push_back(line);
    }
  }
  out_.open(path, std::ios::out | std::ios::trunc);
  if (!out_) {
    throw std::runtime_error(
        fmt::format("log.metrics: cannot write {}: {}", path, std::strerror(errno)));
  }
  for (const auto& line : kept) out_ << line << '\n';
  out_.flush();
}

void MetricsFile::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

void check_metrics_path(const std::string& path) {
  std::ofstream probe(path, std::ios::out | std::ios::app);
  if (!probe) {
    throw std::invalid_argument(
        fmt::format("log.metrics = '{}': cannot write it: {}", path, std::strerror(errno)));
  }
}

std::string metrics_path(const std::string& configured, const std::string& checkpoint_dir) {
  if (configured == "off") return "";
  if (!configured.empty()) return configured;
  return checkpoint_dir.empty() ? "" : checkpoint_dir + "/metrics.jsonl";
}

}  // namespace train
