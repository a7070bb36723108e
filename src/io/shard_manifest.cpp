#include "shard_manifest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace io {

namespace {

using nlohmann::json;

json piece_json(const ShardPiece& p) {
  return {{"name", p.name},
          {"offset", p.offset},
          {"count", p.count},
          {"key", p.key},
          {"key_offset", p.key_offset}};
}

ShardPiece parse_piece(const json& j) {
  ShardPiece p;
  p.name = j.at("name").get<std::string>();
  p.offset = j.at("offset").get<int64_t>();
  p.count = j.at("count").get<int64_t>();
  p.key = j.at("key").get<std::string>();
  p.key_offset = j.at("key_offset").get<int64_t>();
  return p;
}

ShardFile parse_file(const json& j) {
  ShardFile f;
  f.file = j.at("file").get<std::string>();
  f.rank = j.at("rank").get<int>();
  f.bytes = j.at("bytes").get<int64_t>();
  f.crc32 = j.at("crc32").get<std::string>();
  for (const auto& p : j.at("pieces")) f.pieces.push_back(parse_piece(p));
  return f;
}

ShardManifest parse_fields(const json& j) {
  ShardManifest m;
  m.world_size = j.at("world_size").get<int>();
  m.shard_mode = j.at("shard_mode").get<std::string>();
  m.step = j.at("step").get<int64_t>();
  m.global_batch_size = j.at("global_batch_size").get<int64_t>();
  m.seed = j.at("seed").get<uint64_t>();
  m.config = j.at("config").get<std::string>();
  m.schedule = j.value("schedule", std::string());
  m.base = j.value("base", std::string());
  m.base_hash = j.value("base_hash", std::string());
  for (const auto& [name, t] : j.at("tensors").items()) {
    m.tensors[name] = {t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
                       t.value("order", std::vector<int64_t>{})};
  }
  for (const auto& f : j.at("files")) m.files.push_back(parse_file(f));
  return m;
}

}  // namespace

std::vector<int64_t> element_order(const std::vector<int64_t>& sizes,
                                   const std::vector<int64_t>& strides) {
  if (sizes.size() != strides.size()) {
    throw std::invalid_argument(
        fmt::format("element_order: {} sizes, {} strides", sizes.size(), strides.size()));
  }
  std::vector<int64_t> ones, order;
  for (size_t d = 0; d < sizes.size(); ++d) (sizes[d] == 1 ? ones : order).push_back(d);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;  // dense: each stride is the product of the sizes after it in the order
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (strides[*it] != expected) {
      throw std::invalid_argument(fmt::format("element_order: sizes [{}] with strides [{}] are not "
                                              "a dense tensor",
                                              fmt::join(sizes, ", "), fmt::join(strides, ", ")));
    }
    expected *= sizes[*it];
  }
  if (std::is_sorted(order.begin(), order.end())) return {};  // row-major
  ones.insert(ones.end(), order.begin(), order.end());
  return ones;
}

int64_t LogicalTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string step_dir_name(int64_t step) { return fmt::format("step_{:06d}", step); }
std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

std::string manifest_to_json(const ShardManifest& m) {
  json tensors = json::object();
  bool ordered = false;
  for (const auto& [name, t] : m.tensors) {
    tensors[name] = {{"dtype", t.dtype}, {"shape", t.shape}};
    if (!t.order.empty()) tensors[name]["order"] = t.order;
    ordered = ordered || !t.order.empty();
  }
  json files = json::array();
  for (const auto& f : m.files) {
    json pieces = json::array();
    for (const auto& p : f.pieces) pieces.push_back(piece_json(p));
    files.push_back({{"file", f.file},
                     {"rank", f.rank},
                     {"bytes", f.bytes},
                     {"crc32", f.crc32},
                     {"pieces", pieces}});
  }
  json j = {{"format", ordered ? kShardManifestFormatV2 : kShardManifestFormat},
            {"world_size", m.world_size},
            {"shard_mode", m.shard_mode},
            {"step", m.step},
            {"global_batch_size", m.global_batch_size},
            {"seed", m.seed},
            {"config", m.config},
            {"tensors", tensors},
            {"files", files}};
  if (!m.schedule.empty()) j["schedule"] = m.schedule;
  if (m.adapters_only()) {
    j["base"] = m.base;
    j["base_hash"] = m.base_hash;
  }
  return j.dump(1);
}

ShardManifest parse_manifest(const std::string& text, const std::string& source) {
  ShardManifest m;
  try {
    const json j = json::parse(text);
    const std::string format = j.value("format", "");
    if (format != kShardManifestFormat && format != kShardManifestFormatV2) {
      throw ShardManifestError(fmt::format("{}: not a sharded checkpoint manifest (format is not "
                                           "'{}' or '{}')",
                                           source, kShardManifestFormat, kShardManifestFormatV2));
    }
    m = parse_fields(j);
  } catch (const json::exception& e) {
    throw ShardManifestError(fmt::format("{}: damaged manifest: {}", source, e.what()));
  }
  check_layout(m, source);
  return m;
}

ShardManifest read_manifest(const std::string& step_dir) {
  const std::string path = (std::filesystem::path(step_dir) / kShardManifestName).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ShardFileDamaged(fmt::format("{}: missing manifest", path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), path);
}

void check_layout(const ShardManifest& m, const std::string& source) {
  for (const auto& [name, t] : m.tensors) {
    if (t.order.empty()) continue;
    std::vector<int64_t> dims = t.order;
    std::sort(dims.begin(), dims.end());
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims.size() != t.shape.size() || dims[d] != static_cast<int64_t>(d)) {
        throw ShardManifestError(
            fmt::format("{}: the order [{}] of '{}' is not a permutation of its {} dimensions",
                        source, fmt::join(t.order, ", "), name, t.shape.size()));
      }
    }
  }
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> spans;
  for (const auto& f : m.files) {
    for (const auto& p : f.pieces) {
      const auto it = m.tensors.find(p.name);
      if (it == m.tensors.end()) {
        throw ShardManifestError(fmt::format(
            "{}: file {} holds '{}', which the manifest does not declare", source, f.file, p.name));
      }
      if (p.offset < 0 || p.count <= 0 || p.key_offset < 0 ||
          p.offset + p.count > it->second.numel()) {
        throw ShardManifestError(
            fmt::format("{}: file {} holds elements [{}, {}) of '{}', which has {}", source, f.file,
                        p.offset, p.offset + p.count, p.name, it->second.numel()));
      }
      spans[p.name].emplace_back(p.offset, p.offset + p.count);
    }
  }
  for (const auto& [name, t] : m.tensors) {
    auto& s = spans[name];
    std::sort(s.begin(), s.end());
    int64_t next = 0;
    for (const auto& [b, e] : s) {
      if (b != next) {
        throw ShardManifestError(fmt::format("{}: elements of '{}' from {} are {}", source, name,
                                             std::min(b, next),
                                             b < next ? "held twice" : "missing"));
      }
      next = e;
    }
    if (next != t.numel()) {
      throw ShardManifestError(
          fmt::format("{}: elements of '{}' from {} are missing", source, name, next));
    }
  }
}

std::vector<PieceRead> pieces_for(const ShardManifest& m, const std::string& name, int64_t offset,
                                  int64_t count) {
  const auto it = m.tensors.find(name);
  if (it == m.tensors.end()) {
    throw ShardManifestError(fmt::format("sharded checkpoint has no tensor '{}'", name));
  }
  if (offset < 0 || count < 0 || offset + count > it->second.numel()) {
    throw ShardManifestError(fmt::format("elements [{}, {}) are outside '{}' ({} elements)", offset,
                                         offset + count, name, it->second.numel()));
  }
  std::vector<PieceRead> out;
  for (const auto& f : m.files) {
    for (const auto& p : f.pieces) {
      if (p.name != name) continue;
      const int64_t b = std::max(p.offset, offset);
      const int64_t e = std::min(p.offset + p.count, offset + count);
      if (b >= e) continue;
      out.push_back({f.file, {name, b, e - b, p.key, p.key_offset + (b - p.offset)}});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const PieceRead& a, const PieceRead& b) { return a.piece.offset < b.piece.offset; });
  return out;
}

std::string file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ShardFileDamaged(fmt::format("{}: missing shard file", path));
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  if (in.bad()) throw ShardFileDamaged(fmt::format("{}: cannot be read", path));
  return fmt::format("crc32:{:08x}", static_cast<uint32_t>(crc));
}

void verify_shard_files(const std::string& step_dir, const ShardManifest& m) {
  namespace fs = std::filesystem;
  for (const auto& f : m.files) {
    const std::string path = (fs::path(step_dir) / f.file).string();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw ShardFileDamaged(fmt::format("{}: missing shard file", path));
    if (static_cast<int64_t>(size) != f.bytes) {
      throw ShardFileDamaged(
          fmt::format("{}: shard file has {} bytes, the manifest says {}", path, size, f.bytes));
    }
    const std::string crc = file_crc32(path);
    if (crc != f.crc32) {
      throw ShardFileDamaged(fmt::format(
          "{}: shard file is damaged ({} where the manifest says {})", path, crc, f.crc32));
    }
  }
}

}  // namespace io
