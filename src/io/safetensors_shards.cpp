#include "io/safetensors_shards.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"

namespace io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shard_name(size_t i, size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

// The index's weight_map, checked: name -> file (relative to the directory).
std::map<std::string, std::string> read_index(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw SafetensorsError(fmt::format("{}: cannot be read", file));
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    throw SafetensorsError(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw SafetensorsError(fmt::format("{}: no \"weight_map\" object", file));
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
      throw SafetensorsError(fmt::format("{}: weight_map[\"{}\"] = {} is not a file name beside it",
                                         file, name, shard.dump()));
    }
    map.emplace(name, shard.get<std::string>());
  }
  return map;
}

}  // namespace

int64_t parse_shard_size(const std::string& text) {
  static const std::regex size(R"(\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(text, m, size)) {
    throw std::invalid_argument(fmt::format(
        "'{}' is not a size: bytes, or a number with KB, MB, GB (powers of 1000) or KiB, MiB, GiB "
        "(powers of 1024), as in 5GB",
        text));
  }
  std::string unit = m[2].str();
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, double> scale = {{"", 1.0},
                                               {"B", 1.0},
                                               {"KB", 1e3},
                                               {"MB", 1e6},
                                               {"GB", 1e9},
                                               {"TB", 1e12},
                                               {"KIB", 1024.0},
                                               {"MIB", 1048576.0},
                                               {"GIB", 1073741824.0},
                                               {"TIB", 1099511627776.0}};
  const double bytes = std::stod(m[1].str()) * scale.at(unit);
  if (bytes < 1.0) throw std::invalid_argument(fmt::format("'{}' is less than one byte", text));
  return static_cast<int64_t>(bytes);
}

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::error_code ec;
  const fs::path index = fs::path(dir) / kSafetensorsIndex;
  if (fs::exists(index, ec)) {
    std::vector<std::string> files;
    std::set<std::string> seen;
    for (const auto& [name, shard] : read_index(index.string())) {
      if (seen.insert(shard).second) files.push_back((fs::path(dir) / shard).string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }
  const fs::path single = fs::path(dir) / kSafetensorsFile;
  if (fs::exists(single, ec)) return {single.string()};
  return {};
}

std::map<std::string, at::Tensor> read_safetensors_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path index = fs::path(dir) / kSafetensorsIndex;
  if (!fs::exists(index, ec)) return read_safetensors((fs::path(dir) / kSafetensorsFile).string());
  const auto map = read_index(index.string());
  std::map<std::string, at::Tensor> out;
  std::set<std::string> shards;
  for (const auto& [name, shard] : map) shards.insert(shard);
  for (const std::string& shard : shards) {
    const std::string file = (fs::path(dir) / shard).string();
    if (!fs::exists(file, ec)) {
      throw SafetensorsError(
          fmt::format("{}: names the shard {}, which does not exist", index.string(), file));
    }
    for (auto& [name, tensor] : read_safetensors(file)) {
      auto it = map.find(name);
      if (it == map.end() || it->second != shard) {
        throw SafetensorsError(fmt::format("{}: holds '{}', which {} puts {}", file, name,
                                           index.string(),
                                           it == map.end() ? "nowhere" : "in " + it->second));
      }
      out.emplace(name, std::move(tensor));
    }
  }
  for (const auto& [name, shard] : map) {
    if (!out.count(name)) {
      throw SafetensorsError(fmt::format("{}: '{}' is not in {}, where {} puts it",
                                         (fs::path(dir) / shard).string(), name, shard,
                                         index.string()));
    }
  }
  return out;
}

std::vector<std::string> write_safetensors_dir(const std::string& dir,
                                               const std::map<std::string, at::Tensor>& tensors,
                                               int64_t max_shard_bytes,
                                               const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  return write_safetensors_dir(
      dir, entries, [&](const TensorEntry& e) { return tensors.at(e.name); }, max_shard_bytes,
      metadata);
}

std::vector<std::string> write_safetensors_dir(
    const std::string& dir, std::vector<TensorEntry> entries,
    const std::function<at::Tensor(const TensorEntry&)>& produce, int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  // Greedy in name order, as save_pretrained: a shard closes when the next tensor would not fit.
  std::sort(entries.begin(), entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  std::vector<std::vector<TensorEntry>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const TensorEntry& e : entries) {
    const int64_t bytes = e.bytes();
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e);
    in_shard += bytes;
    total += bytes;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {  // an earlier export's files
    const std::string f = entry.path().filename().string();
    static const std::regex old(R"(model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?)");
    if (std::regex_match(f, old)) fs::remove(entry.path(), ec);
  }
  std::vector<std::string> written;
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? kSafetensorsFile : shard_name(i, shards.size());
    written.push_back((fs::path(dir) / name).string());
    SafetensorsWriter writer(written.back(), shards[i], metadata);
    for (const TensorEntry& e : writer.entries()) {
      writer.write(produce(e));  // one tensor at a time
      index["weight_map"][e.name] = name;
    }
    writer.close();
  }
  if (shards.size() == 1) return written;
  written.push_back((fs::path(dir) / kSafetensorsIndex).string());
  std::ofstream out(written.back());
  out << index.dump(2) << "\n";
  out.close();
  if (!out) throw SafetensorsError(fmt::format("{}: cannot be written", written.back()));
  return written;
}

}  // namespace io
