#include "checkpoint/single_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "checkpoint/files.h"
#include "io/safetensors.h"
#include "models/capabilities.h"

namespace checkpoint {

namespace {

// tensor_checksum's CRC, one tensor at a time.
uLong add_to_crc(uLong crc, const std::string& name, const at::Tensor& t) {
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
  return crc;
}

std::string crc_text(uLong crc) { return fmt::format("crc32:{:08x}", static_cast<uint32_t>(crc)); }

}  // namespace

// CRC-32 (zlib) of every tensor's name and contiguous CPU bytes, in name order (the map's).
std::string tensor_checksum(const std::map<std::string, at::Tensor>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, t] : tensors) crc = add_to_crc(crc, name, t);
  return crc_text(crc);
}

std::vector<std::pair<std::string, at::Tensor>> model_entries(models::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    out.emplace_back(param_key(item.key()), item.value());
  }
  const auto* cache = models::as<models::EmbeddingCache>(model);
  auto caches = cache != nullptr ? cache->cache_buffer_names() : std::vector<std::string>{};
  if (const auto* frozen = models::as<models::FrozenBase>(model)) {  // loaded from its own path
    const auto names = frozen->frozen_buffer_names();
    caches.insert(caches.end(), names.begin(), names.end());
  }
  for (const auto& item : model.named_buffers()) {
    if (std::find(caches.begin(), caches.end(), item.key()) == caches.end()) {
      out.emplace_back("buffer." + item.key(), item.value());
    }
  }
  return out;
}

std::map<std::string, at::Tensor> checkpoint_tensors(models::Model& model,
                                                     const std::vector<at::Tensor>& exp_avgs,
                                                     const std::vector<at::Tensor>& exp_avg_sqs,
                                                     const std::vector<bool>& muon) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [key, t] : model_entries(model)) tensors.emplace(key, t.detach());
  const auto params = model.named_parameters();
  if (exp_avgs.size() != params.size() || exp_avg_sqs.size() != params.size()) {
    throw std::logic_error("checkpoint_tensors: one pair of moments per parameter");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    tensors.emplace(first_moment_key(params[i].key(), is_muon(muon, i)), exp_avgs[i]);
    if (!is_muon(muon, i)) tensors.emplace(exp_avg_sq_key(params[i].key()), exp_avg_sqs[i]);
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
  std::vector<io::TensorEntry> entries;
  for (const auto& [key, t] : tensors) entries.push_back({key, t.scalar_type(), t.sizes().vec()});
  write_checkpoint_streaming(
      path, std::move(entries), [&](const io::TensorEntry& e) { return tensors.at(e.name); }, meta);
}

void write_checkpoint_streaming(const std::string& path, std::vector<io::TensorEntry> entries,
                                const std::function<at::Tensor(const io::TensorEntry&)>& produce,
                                const CheckpointMeta& meta) {
  std::map<std::string, std::string> metadata = {
      {"format", kSingleFileFormat},
      {"step", std::to_string(meta.step)},
      {"global_batch_size", std::to_string(meta.global_batch_size)},
      {"seed", std::to_string(meta.seed)},
      {"world_size", std::to_string(meta.world_size)},
      {"checksum", crc_text(0)},  // its length reserved; filled in after the data
  };
  if (!meta.config.empty()) metadata["config"] = meta.config;
  if (!meta.schedule.empty()) metadata["schedule"] = meta.schedule;
  if (meta.adapters_only()) {
    metadata["base"] = meta.base;
    metadata["base_hash"] = meta.base_hash;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) {
    throw CheckpointError(fmt::format("cannot create the directory of {}: {}", path, ec.message()),
                          ec.value());
  }
  const std::string tmp = path + ".tmp";
  try {  // whatever fails, nothing of this write is left (a full disk gets its space back)
    io::SafetensorsWriter writer(tmp, std::move(entries), metadata);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (const io::TensorEntry& e : writer.entries()) {  // key order: the checksum's
      const at::Tensor t = produce(e);
      crc = add_to_crc(crc, e.name, t);
      writer.write(t);
    }
    writer.close({{"checksum", crc_text(crc)}});
    fsync_path(tmp, /*directory=*/false);  // the data on disk before the name
    rename_or_throw(tmp, path);
  } catch (const io::SafetensorsError& e) {
    std::remove(tmp.c_str());
    throw CheckpointError(e.what(), e.error_number());
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(parent_dir(path), /*directory=*/true);
}

Checkpoint read_single_file(const std::string& path) {
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
  if (format == meta.end() || format->second != kSingleFileFormat) {
    throw CheckpointError(
        fmt::format("{}: not a trainer checkpoint (metadata 'format' is '{}', expected '{}')", path,
                    format == meta.end() ? "" : format->second, kSingleFileFormat));
  }
  ckpt.meta.step = metadata_number(path, meta, "step");
  ckpt.meta.global_batch_size = metadata_number(path, meta, "global_batch_size");
  ckpt.meta.seed = metadata_unsigned(path, meta, "seed");
  ckpt.meta.world_size = static_cast<int>(metadata_number(path, meta, "world_size"));
  if (const auto c = meta.find("config"); c != meta.end()) ckpt.meta.config = c->second;
  if (const auto s = meta.find("schedule"); s != meta.end()) ckpt.meta.schedule = s->second;
  if (const auto b = meta.find("base"); b != meta.end()) ckpt.meta.base = b->second;
  if (const auto h = meta.find("base_hash"); h != meta.end()) ckpt.meta.base_hash = h->second;
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

}  // namespace checkpoint
