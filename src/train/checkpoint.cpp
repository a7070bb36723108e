#include "train/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>

#include <unistd.h>

#include "io/checkpoint_keys.h"
#include "io/output_dir.h"
#include "io/safetensors.h"
#include "io/shard_manifest.h"
#include "models/capabilities.h"
#include "train/checkpoint_sharded.h"

namespace train {
namespace {

constexpr const char* kFormat = "trainer-checkpoint-1";

// Everything a checkpoint of `model` holds: its entries, then both moments of each parameter
// (with the parameter, whose shape and dtype they share).
std::vector<std::pair<std::string, at::Tensor>> expected_tensors(models::Model& model) {
  auto out = model_entries(model);
  const auto params = model.named_parameters();
  for (const auto& item : params) out.emplace_back(exp_avg_key(item.key()), item.value());
  for (const auto& item : params) out.emplace_back(exp_avg_sq_key(item.key()), item.value());
  return out;
}

template <class T>
T parse_number(const std::string& path, const std::map<std::string, std::string>& meta,
               const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end())
    throw CheckpointError(fmt::format("{}: no '{}' in its metadata", path, key));
  T v{};
  const auto& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw CheckpointError(fmt::format("{}: metadata '{}' = '{}' is not a number", path, key, s));
  }
  return v;
}

// A tensor's shape and dtype, as a checkpoint holds it (a tensor, or an opened sharded
// checkpoint's logical tensor).
struct Held {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

std::string describe(at::IntArrayRef sizes, at::ScalarType dtype) {
  return fmt::format("{} {}", sizes, c10::toString(dtype));
}
std::string describe(const at::Tensor& t) { return describe(t.sizes(), t.scalar_type()); }

std::map<std::string, Held> held_tensors(const Checkpoint& ckpt) {
  std::map<std::string, Held> out;
  for (const auto& [key, t] : ckpt.tensors) out[key] = {t.sizes().vec(), t.scalar_type()};
  if (!ckpt.manifest) return out;
  for (const auto& [key, logical] : ckpt.manifest->tensors) {
    const auto dtype = io::dtype_from_name(logical.dtype);
    if (!dtype) {
      throw CheckpointDamaged(fmt::format("{}/{}: '{}' has the unknown dtype '{}'", ckpt.path,
                                          io::kShardManifestName, key, logical.dtype));
    }
    out[key] = {logical.shape, *dtype};
  }
  return out;
}

}  // namespace

// CRC-32 (zlib) of every tensor's name and contiguous CPU bytes, in name order (the map's).
static std::string tensor_checksum(const std::map<std::string, at::Tensor>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, t] : tensors) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const Bytef*>(c.data_ptr());
    size_t left = c.nbytes();
    while (left > 0) {  // crc32 takes an unsigned int length
      const uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
      crc = crc32(crc, bytes, chunk);
      bytes += chunk;
      left -= chunk;
    }
  }
  return fmt::format("crc32:{:08x}", static_cast<uint32_t>(crc));
}

std::vector<std::pair<std::string, at::Tensor>> model_entries(models::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    out.emplace_back(std::string(io::kParamKeyPrefix) + item.key(), item.value());
  }
  const auto* cache = models::as<models::EmbeddingCache>(model);
  const auto caches = cache != nullptr ? cache->cache_buffer_names() : std::vector<std::string>{};
  for (const auto& item : model.named_buffers()) {
    if (std::find(caches.begin(), caches.end(), item.key()) == caches.end()) {
      out.emplace_back("buffer." + item.key(), item.value());
    }
  }
  return out;
}

std::string exp_avg_key(const std::string& param) { return "adamw.exp_avg." + param; }
std::string exp_avg_sq_key(const std::string& param) { return "adamw.exp_avg_sq." + param; }

std::map<std::string, at::Tensor> checkpoint_tensors(models::Model& model,
                                                     const std::vector<at::Tensor>& exp_avgs,
                                                     const std::vector<at::Tensor>& exp_avg_sqs) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [key, t] : model_entries(model)) tensors.emplace(key, t.detach());
  const auto params = model.named_parameters();
  if (exp_avgs.size() != params.size() || exp_avg_sqs.size() != params.size()) {
    throw std::logic_error("checkpoint_tensors: one pair of moments per parameter");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    tensors.emplace(exp_avg_key(params[i].key()), exp_avgs[i]);
    tensors.emplace(exp_avg_sq_key(params[i].key()), exp_avg_sqs[i]);
  }
  return tensors;
}

void write_checkpoint(const std::string& path, models::Model& model,
                      const std::vector<at::Tensor>& exp_avgs,
                      const std::vector<at::Tensor>& exp_avg_sqs, const CheckpointMeta& meta) {
  write_checkpoint_tensors(path, checkpoint_tensors(model, exp_avgs, exp_avg_sqs), meta);
}

void write_checkpoint_tensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const CheckpointMeta& meta) {
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"step", std::to_string(meta.step)},
      {"global_batch_size", std::to_string(meta.global_batch_size)},
      {"seed", std::to_string(meta.seed)},
      {"world_size", std::to_string(meta.world_size)},
      {"checksum", tensor_checksum(tensors)},
  };
  if (!meta.config.empty()) metadata["config"] = meta.config;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) {
    throw CheckpointError(fmt::format("cannot create the directory of {}: {}", path, ec.message()));
  }
  const std::string tmp = path + ".tmp";
  try {
    io::write_safetensors(tmp, tensors, metadata);
  } catch (const io::SafetensorsError& e) {
    std::remove(tmp.c_str());
    throw CheckpointError(e.what());
  }
  fsync_path(tmp, /*directory=*/false);  // the data on disk before the name
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw CheckpointError(fmt::format("cannot move {} into place as {}", tmp, path));
  }
  fsync_path(parent_dir(path), /*directory=*/true);
}

Checkpoint read_checkpoint(const std::string& path, ShardedRead sharded) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return sharded == ShardedRead::kOpen ? open_sharded_checkpoint(path)
                                         : read_sharded_checkpoint(path);
  }
  Checkpoint ckpt;
  ckpt.path = path;
  std::map<std::string, std::string> meta;
  try {
    ckpt.tensors = io::read_safetensors(path, &meta);
  } catch (const io::SafetensorsError& e) {
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {  // it exists: damaged, not missing
      std::fclose(f);
      throw CheckpointDamaged(e.what());
    }
    throw CheckpointError(e.what());
  }
  const auto format = meta.find("format");
  if (format == meta.end() || format->second != kFormat) {
    throw CheckpointError(
        fmt::format("{}: not a trainer checkpoint (metadata 'format' is '{}', expected '{}')", path,
                    format == meta.end() ? "" : format->second, kFormat));
  }
  ckpt.meta.step = parse_number<int64_t>(path, meta, "step");
  ckpt.meta.global_batch_size = parse_number<int64_t>(path, meta, "global_batch_size");
  ckpt.meta.seed = parse_number<uint64_t>(path, meta, "seed");
  ckpt.meta.world_size = parse_number<int>(path, meta, "world_size");
  if (const auto c = meta.find("config"); c != meta.end()) ckpt.meta.config = c->second;
  // Checkpoints written before checksums were recorded carry none: nothing to verify.
  if (const auto sum = meta.find("checksum"); sum != meta.end()) {
    const std::string actual = tensor_checksum(ckpt.tensors);
    if (actual != sum->second) {
      throw CheckpointDamaged(fmt::format(
          "{}: corrupt: the tensor data's checksum is {}, the file's metadata says {} (the file "
          "changed after it was written)",
          path, actual, sum->second));
    }
  }
  return ckpt;
}

void check_compatible(const Checkpoint& ckpt, models::Model& model) {
  const auto expected = expected_tensors(model);
  const auto held = held_tensors(ckpt);
  for (const auto& [key, t] : expected) {
    const auto it = held.find(key);
    if (it == held.end()) {
      throw CheckpointError(fmt::format(
          "{}: the model has '{}' ({}), the checkpoint does not: it was written for another model "
          "(compare the model section of the config)",
          ckpt.path, key, describe(t)));
    }
    if (t.sizes() != at::IntArrayRef(it->second.sizes) || it->second.dtype != t.scalar_type()) {
      throw CheckpointError(fmt::format(
          "{}: '{}' is {} in the checkpoint but {} in the model (compare the model section of "
          "the config)",
          ckpt.path, key, describe(it->second.sizes, it->second.dtype), describe(t)));
    }
  }
  std::set<std::string> keys;
  for (const auto& [key, t] : expected) keys.insert(key);
  for (const auto& [key, h] : held) {
    if (!keys.count(key)) {
      throw CheckpointError(fmt::format(
          "{}: the checkpoint has '{}' ({}), the model does not: it was written for another "
          "model (compare the model section of the config)",
          ckpt.path, key, describe(h.sizes, h.dtype)));
    }
  }
}

void apply_model_state(const Checkpoint& ckpt, models::Model& model) {
  at::NoGradGuard no_grad;
  if (!ckpt.manifest) {
    for (auto& [key, t] : model_entries(model)) t.copy_(ckpt.tensors.at(key));
    return;
  }
  // Straight from the files into the model's tensors: no copy of the model besides the model.
  ShardedReader reader(ckpt.path, *ckpt.manifest);
  for (auto& [key, t] : model_entries(model)) reader.read_whole(key, t);
}

void check_checkpoint_dir(const std::string& dir) {
  try {
    io::check_output_dir("checkpoint.dir", dir);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }
}

std::string latest_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::string best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".safetensors") continue;
    const std::string path = entry.path().string();
    try {
      const auto meta = io::read_safetensors_metadata(path);
      const auto format = meta.find("format");
      if (format == meta.end() || format->second != kFormat) continue;
      const auto step = parse_number<int64_t>(path, meta, "step");
      // Ties (final and step_N of the same step): the name decides, so the choice is stable.
      if (step > best_step || (step == best_step && path > best)) {
        best_step = step;
        best = path;
      }
    } catch (const std::exception&) {
      continue;  // not a checkpoint, or a damaged one: an older checkpoint is better than none
    }
  }
  return best;
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> found;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string();
    if (is_sharded_checkpoint(path)) {                     // a step directory with its manifest
      int64_t step = std::numeric_limits<int64_t>::max();  // unparsable: first, as below
      try {
        step = io::read_manifest(path).step;
      } catch (const io::ShardManifestError&) {
      }
      found.emplace_back(step, path);
      continue;
    }
    if (!entry.is_regular_file() || entry.path().extension() != ".safetensors") continue;
    // An unreadable header (a truncated or damaged file) cannot be ordered by step: such files
    // come first, so that the caller tries them (they fail at once) and reports them.
    int64_t step = std::numeric_limits<int64_t>::max();
    try {
      const auto meta = io::read_safetensors_metadata(path);
      const auto format = meta.find("format");
      if (format == meta.end() || format->second != kFormat) continue;  // not a checkpoint
      step = parse_number<int64_t>(path, meta, "step");
    } catch (const std::exception&) {
    }
    found.emplace_back(step, path);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string newest_good_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                   Checkpoint* out, ShardedRead sharded) {
  for (const auto& path : checkpoints_newest_first(dir)) {
    try {
      *out = read_checkpoint(path, sharded);
      return path;
    } catch (const CheckpointDamaged& e) {
      skipped->push_back(e.what());
    } catch (const CheckpointError& e) {
      // A header that does not parse at all also means a damaged file here: it was listed as a
      // checkpoint candidate by name.
      skipped->push_back(e.what());
    }
  }
  return "";
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep) {
  std::vector<std::string> deleted;
  if (keep <= 0) return deleted;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> periodic;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    const bool file = std::sscanf(name.c_str(), "step_%ld.safetensors", &step) == 1 &&
                      name == fmt::format("step_{:06d}.safetensors", step);
    // Sharded: a complete step directory (one with its manifest) counts like a file.
    if (file || (std::sscanf(name.c_str(), "step_%ld", &step) == 1 &&
                 name == io::step_dir_name(step) && is_sharded_checkpoint(entry.path().string()))) {
      periodic.emplace_back(step, entry.path().string());
    }
  }
  std::sort(periodic.rbegin(), periodic.rend());
  for (size_t i = static_cast<size_t>(keep); i < periodic.size(); ++i) {
    const std::string& path = periodic[i].second;
    const bool removed =
        is_sharded_checkpoint(path) ? remove_step_dir(path) : std::remove(path.c_str()) == 0;
    if (removed) deleted.push_back(path);
  }
  return deleted;
}

std::vector<std::string> remove_unfinished_writes(const std::string& dir, const std::string& keep) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  const std::string suffix = ".tmp";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string path = entry.path().string();
    if (!name.ends_with(suffix) || path == keep) continue;
    const bool ours =
        name.starts_with("step_") || name.starts_with("final") || name.starts_with("oom_step_");
    if (!ours) continue;
    const bool gone =
        entry.is_directory(ec) ? remove_step_dir(path) : std::remove(path.c_str()) == 0;
    if (gone) removed.push_back(path);
  }
  return removed;
}

}  // namespace train
