#include "checkpoint/sharded.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/single_file.h"
#include "ddp/shard.h"
#include "io/safetensors.h"

namespace checkpoint {
namespace {

std::string bucket_key(size_t bucket, const char* what) {
  return fmt::format("bucket_{:05d}.{}", bucket, what);
}

// The three logical tensors of a parameter and the state that holds each: its key for a
// parameter (a matrix Muon updates has no second moment: "").
struct Part {
  std::string (*key)(const std::string& name, bool muon);
  const char* suffix;
  const std::vector<at::Tensor> ShardedState::*state;
};

std::string param_part(const std::string& name, bool) { return param_key(name); }

const Part kParts[] = {{param_part, "param", &ShardedState::param_blocks},
                       {first_moment_key, "exp_avg", &ShardedState::exp_avgs},
                       {second_moment_key, "exp_avg_sq", &ShardedState::exp_avg_sqs}};

// The key of `part` of parameter `p` ("": none).
std::string key_of(const Part& part, const ShardedState& s, size_t p) {
  return part.key(s.params[p].first, is_muon(s.muon, p));
}

// Sharded: this rank's block of each bucket, a piece per parameter it owns elements of.
void bucket_pieces(const ShardedState& s, int world, int rank, bool with_tensors,
                   ShardContent& out) {
  const auto& layout = *s.layout;
  for (size_t b = 0; b < layout.size(); ++b) {
    const ddp::BucketShard shard = ddp::shard_bucket(layout[b].numel, world, rank);
    for (size_t i = 0; i < layout[b].params.size(); ++i) {
      const auto& [name, param] = s.params[layout[b].params[i]];
      const auto [first, last] = shard.owned(layout[b].offsets[i], param.numel());
      if (first >= last) continue;
      for (const Part& part : kParts) {
        const std::string key = key_of(part, s, layout[b].params[i]);
        if (key.empty()) continue;
        out.pieces.push_back({key, first - layout[b].offsets[i], last - first,
                              bucket_key(b, part.suffix), first - shard.begin});
      }
    }
    if (!with_tensors) continue;
    for (const Part& part : kParts) out.tensors[bucket_key(b, part.suffix)] = (s.*part.state)[b];
  }
}

// `t` (of the logical tensor's shape) flat in the element order `order`: a view when `t` is held
// so (a channels-last weight), else a copy.
at::Tensor flat_in_order(const at::Tensor& t, const std::vector<int64_t>& order) {
  return (order.empty() ? t : t.permute(order)).reshape({-1});
}

// Unsharded: rank r's slice of every parameter and moment, in the parameter's element order.
void sliced_pieces(const ShardedState& s, int world, int rank, bool with_tensors,
                   ShardContent& out) {
  for (size_t p = 0; p < s.params.size(); ++p) {
    const auto& [name, param] = s.params[p];
    const std::vector<int64_t> order = element_order_of(param);
    const int64_t n = param.numel();
    const int64_t chunk = (n + world - 1) / world;
    const int64_t first = std::min(n, rank * chunk);
    const int64_t count = std::min(n, first + chunk) - first;
    if (count == 0) continue;
    for (const Part& part : kParts) {
      const std::string key = key_of(part, s, p);
      if (key.empty()) continue;
      out.pieces.push_back({key, first, count, key, 0});
      if (!with_tensors) continue;
      const at::Tensor& full =
          part.state == &ShardedState::param_blocks ? param : (s.*part.state)[p];
      out.tensors[key] = flat_in_order(full.detach(), order).narrow(0, first, count);
    }
  }
}

// The shape of `logical` permuted by its order (the shape its flat elements are row-major in).
std::vector<int64_t> ordered_shape(const io::LogicalTensor& logical) {
  if (logical.order.empty()) return logical.shape;
  std::vector<int64_t> shape;
  for (int64_t d : logical.order) shape.push_back(logical.shape[d]);
  return shape;
}

// `flat`, the elements of `logical` in its element order, as a row-major tensor of its shape.
at::Tensor from_order(const at::Tensor& flat, const io::LogicalTensor& logical) {
  if (logical.order.empty()) return flat.view(logical.shape);
  std::vector<int64_t> inverse(logical.order.size());
  for (size_t i = 0; i < logical.order.size(); ++i) inverse[logical.order[i]] = i;
  return flat.view(ordered_shape(logical)).permute(inverse).contiguous();
}

// The logical tensor `name` assembled from its pieces.
at::Tensor assemble(const io::ShardManifest& m, const std::string& dir, const std::string& name,
                    const io::LogicalTensor& logical,
                    const std::map<std::string, std::map<std::string, at::Tensor>>& files) {
  const auto dtype = io::dtype_from_name(logical.dtype);
  if (!dtype) {
    throw CheckpointDamaged(fmt::format("{}/{}: '{}' has the unknown dtype '{}'", dir,
                                        io::kShardManifestName, name, logical.dtype));
  }
  at::Tensor out = at::empty({logical.numel()}, at::TensorOptions().dtype(*dtype));
  for (const auto& read : io::pieces_for(m, name, 0, logical.numel())) {
    const auto& tensors = files.at(read.file);
    const auto it = tensors.find(read.piece.key);
    if (it == tensors.end() || it->second.numel() < read.piece.key_offset + read.piece.count) {
      throw CheckpointDamaged(fmt::format("{}/{}: has no tensor '{}' of {} elements for '{}'", dir,
                                          read.file, read.piece.key,
                                          read.piece.key_offset + read.piece.count, name));
    }
    out.narrow(0, read.piece.offset, read.piece.count)
        .copy_(it->second.reshape({-1}).narrow(0, read.piece.key_offset, read.piece.count));
  }
  return from_order(out, logical);
}

}  // namespace

std::vector<int64_t> element_order_of(const at::Tensor& t) {
  return io::element_order(t.sizes().vec(), t.strides().vec());
}

ShardContent shard_content(const ShardedState& state, int world, int rank, bool with_tensors) {
  ShardContent out;
  if (state.layout != nullptr) {
    bucket_pieces(state, world, rank, with_tensors, out);
  } else {
    sliced_pieces(state, world, rank, with_tensors, out);
  }
  if (rank != 0) return out;
  for (const auto& [key, t] : state.buffers) {
    if (t.numel() > 0) out.pieces.push_back({key, 0, t.numel(), key, 0});
    if (with_tensors) out.tensors[key] = t.detach();
  }
  return out;
}

std::map<std::string, io::LogicalTensor> logical_tensors(const ShardedState& state) {
  std::map<std::string, io::LogicalTensor> out;
  auto add = [&out](const std::string& key, const at::Tensor& t) {
    const auto dtype = io::dtype_name(t.scalar_type());
    if (!dtype) {
      throw CheckpointError(fmt::format("'{}': dtype {} cannot be checkpointed", key,
                                        c10::toString(t.scalar_type())));
    }
    out[key] = {*dtype, t.sizes().vec()};
  };
  for (size_t p = 0; p < state.params.size(); ++p) {
    const at::Tensor& param = state.params[p].second;
    for (const Part& part : kParts) {
      const std::string key = key_of(part, state, p);
      if (key.empty()) continue;
      add(key, param);
      out[key].order = element_order_of(param);  // the buckets' and sliced_pieces'
    }
  }
  for (const auto& [key, t] : state.buffers) add(key, t);  // whole, row-major
  return out;
}

io::ShardFile write_shard_file(const std::string& step_tmp_dir, int rank, int64_t step,
                               const std::map<std::string, at::Tensor>& tensors) {
  std::error_code ec;  // ranks race to create it: the mkdir below decides
  std::filesystem::create_directories(parent_dir(step_tmp_dir), ec);
  if (::mkdir(step_tmp_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    throw CheckpointError(fmt::format("cannot create {}: {}", step_tmp_dir, std::strerror(err)),
                          err);
  }
  io::ShardFile file;
  file.file = io::shard_file_name(rank);
  file.rank = rank;
  const std::string path = step_tmp_dir + "/" + file.file;
  const std::string tmp = path + ".tmp";
  try {  // whatever fails, this file is not left (rank 0 removes the directory after the vote)
    io::write_safetensors(tmp, tensors, {{kShardStepKey, std::to_string(step)}});
    fsync_path(tmp, /*directory=*/false);
    rename_or_throw(tmp, path);
  } catch (const io::SafetensorsError& e) {
    std::remove(tmp.c_str());
    throw CheckpointError(e.what(), e.error_number());
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  }
  file.bytes = st.st_size;
  try {
    file.crc32 = io::file_crc32(path);
  } catch (const io::ShardManifestError& e) {
    throw CheckpointError(e.what());
  }
  return file;
}

void commit_sharded_checkpoint(const std::string& step_dir, const io::ShardManifest& manifest) {
  const std::string tmp_dir = step_dir + ".tmp";
  std::set<std::string> listed = {io::kShardManifestName};
  for (const auto& f : manifest.files) listed.insert(f.file);
  for (const auto& name : files_in(tmp_dir)) {
    if (!listed.count(name)) std::remove((tmp_dir + "/" + name).c_str());
  }
  const std::string path = tmp_dir + "/" + io::kShardManifestName;
  const std::string tmp = path + ".tmp";
  if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    const std::string text = io::manifest_to_json(manifest);
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const int write_err = ok ? 0 : errno;
    const bool closed = std::fclose(f) == 0;
    if (!closed || !ok) {
      const int err = ok ? errno : write_err;
      std::remove(tmp.c_str());
      throw CheckpointError(fmt::format("cannot write {}: {}", tmp, std::strerror(err)), err);
    }
  } else {
    const int err = errno;
    throw CheckpointError(fmt::format("cannot write {}: {}", tmp, std::strerror(err)), err);
  }
  fsync_path(tmp, /*directory=*/false);
  rename_or_throw(tmp, path);
  fsync_path(tmp_dir, /*directory=*/true);
  if (is_sharded_checkpoint(step_dir)) {  // the same step written again (a resumed run's final)
    // Swapped in one step, so that step_dir is a complete checkpoint at every instant; the old
    // one, under the temporary name now, goes after (left by a kill: removed at the next commit).
    // A file system without RENAME_EXCHANGE: the old one is removed first.
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, step_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_path(parent_dir(step_dir), /*directory=*/true);
      remove_step_dir(tmp_dir);
      return;
    }
    remove_step_dir(step_dir);
  }
  rename_or_throw(tmp_dir, step_dir);
  fsync_path(parent_dir(step_dir), /*directory=*/true);
}

namespace {

// io::verify_shard_files, after checking that every file that records its step (every file
// written since they do) is of the manifest's step: a file of another checkpoint (copied in, or
// left by another run) is named as such, not only as a CRC-32 that differs.
void verify_files(const std::string& step_dir, const io::ShardManifest& m) {
  for (const auto& f : m.files) {
    const std::string path = step_dir + "/" + f.file;
    std::map<std::string, std::string> meta;
    try {
      meta = io::read_safetensors_metadata(path);
    } catch (const io::SafetensorsError&) {
      continue;  // missing or damaged: io::verify_shard_files says which
    }
    const auto step = meta.find(kShardStepKey);
    if (step != meta.end() && step->second != std::to_string(m.step)) {
      throw CheckpointDamaged(fmt::format(
          "{}: a shard file of step {} beside the manifest of step {} ({}/{}): the directory "
          "mixes the files of two checkpoints",
          path, step->second, m.step, step_dir, io::kShardManifestName));
    }
  }
  io::verify_shard_files(step_dir, m);
}

}  // namespace

Checkpoint read_sharded_checkpoint(const std::string& step_dir) {
  Checkpoint ckpt;
  ckpt.path = step_dir;
  io::ShardManifest m;
  std::map<std::string, std::map<std::string, at::Tensor>> files;
  try {
    m = io::read_manifest(step_dir);
    verify_files(step_dir, m);
    for (const auto& f : m.files) files[f.file] = io::read_safetensors(step_dir + "/" + f.file);
  } catch (const io::ShardManifestError& e) {
    throw CheckpointDamaged(e.what());
  } catch (const io::SafetensorsError& e) {
    throw CheckpointDamaged(e.what());
  }
  for (const auto& [name, logical] : m.tensors) {
    try {
      ckpt.tensors[name] = assemble(m, step_dir, name, logical, files);
    } catch (const io::ShardManifestError& e) {
      throw CheckpointDamaged(e.what());
    }
  }
  ckpt.meta = {m.step,   m.global_batch_size, m.seed, m.world_size,
               m.config, m.schedule,          m.base, m.base_hash};
  return ckpt;
}

Checkpoint open_sharded_checkpoint(const std::string& step_dir) {
  Checkpoint ckpt;
  ckpt.path = step_dir;
  try {
    io::ShardManifest m = io::read_manifest(step_dir);
    verify_files(step_dir, m);
    ckpt.meta = {m.step,   m.global_batch_size, m.seed, m.world_size,
                 m.config, m.schedule,          m.base, m.base_hash};
    ShardedReader reader(step_dir, std::move(m));
    reader.check_pieces();
    ckpt.manifest = reader.manifest();
  } catch (const io::ShardManifestError& e) {
    throw CheckpointDamaged(e.what());
  }
  return ckpt;
}

CheckpointMeta consolidate_sharded_checkpoint(const std::string& step_dir,
                                              const std::string& path) {
  const Checkpoint opened = open_sharded_checkpoint(step_dir);  // every file verified
  ShardedReader reader(step_dir, *opened.manifest);
  std::vector<io::TensorEntry> entries;
  for (const auto& [name, logical] : opened.manifest->tensors) {
    const auto dtype = io::dtype_from_name(logical.dtype);
    if (!dtype) {
      throw CheckpointDamaged(fmt::format("{}/{}: '{}' has the unknown dtype '{}'", step_dir,
                                          io::kShardManifestName, name, logical.dtype));
    }
    entries.push_back({name, *dtype, logical.shape});
  }
  // One logical tensor at a time, assembled from its pieces in the files.
  write_checkpoint_streaming(
      path, std::move(entries),
      [&](const io::TensorEntry& e) {
        at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
        reader.read_whole(e.name, t);
        return t;
      },
      opened.meta);
  return opened.meta;
}

ShardedReader::ShardedReader(std::string step_dir, io::ShardManifest manifest,
                             size_t max_open_files)
    : dir_(std::move(step_dir)), manifest_(std::move(manifest)),
      max_open_files_(std::max<size_t>(1, max_open_files)) {}

io::SafetensorsRangeReader& ShardedReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    if (files_.size() >= max_open_files_) {  // close the least recently used
      files_.erase(std::min_element(files_.begin(), files_.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      }));
    }
    try {
      it = files_
               .emplace(name,
                        OpenFile{std::make_unique<io::SafetensorsRangeReader>(dir_ + "/" + name)})
               .first;
    } catch (const io::SafetensorsError& e) {
      throw CheckpointDamaged(e.what());
    }
  }
  it->second.last_use = ++uses_;
  return *it->second.reader;
}

void ShardedReader::read(const std::string& name, int64_t offset, const at::Tensor& out) {
  const auto it = manifest_.tensors.find(name);
  const auto dtype =
      it == manifest_.tensors.end() ? std::nullopt : io::dtype_from_name(it->second.dtype);
  if (!dtype || *dtype != out.scalar_type()) {
    throw CheckpointDamaged(
        fmt::format("{}/{}: '{}' is {} there; it is read as {}", dir_, io::kShardManifestName, name,
                    it == manifest_.tensors.end() ? "not a logical tensor" : it->second.dtype,
                    c10::toString(out.scalar_type())));
  }
  const bool direct = out.device().is_cpu() && out.is_contiguous();
  at::Tensor flat =
      direct ? out.view({out.numel()}) : at::empty({out.numel()}, out.options().device(at::kCPU));
  try {
    for (const auto& read : io::pieces_for(manifest_, name, offset, out.numel())) {
      file(read.file).read(read.piece.key, read.piece.key_offset, read.piece.count,
                           flat.narrow(0, read.piece.offset - offset, read.piece.count));
      bytes_read_ += read.piece.count * static_cast<int64_t>(flat.element_size());
    }
  } catch (const io::ShardManifestError& e) {
    throw CheckpointDamaged(e.what());
  } catch (const io::SafetensorsError& e) {
    throw CheckpointDamaged(fmt::format("{} (for '{}')", e.what(), name));
  }
  if (!direct) out.copy_(flat.view(out.sizes()));
}

const std::vector<int64_t>& ShardedReader::order(const std::string& name) const {
  const auto it = manifest_.tensors.find(name);
  if (it == manifest_.tensors.end()) {
    throw CheckpointDamaged(
        fmt::format("{}/{}: has no tensor '{}'", dir_, io::kShardManifestName, name));
  }
  return it->second.order;
}

void ShardedReader::read_whole(const std::string& name, const at::Tensor& out) {
  const std::vector<int64_t>& order = this->order(name);
  const at::Tensor ordered = order.empty() ? out : out.permute(order);
  if (ordered.is_contiguous()) {  // `out` holds the elements in the file's order
    return read(name, 0, ordered.view({-1}));
  }
  // Through a host tensor in the file's order.
  at::Tensor whole = at::empty(ordered.sizes(), out.options().device(at::kCPU));
  read(name, 0, whole);
  ordered.copy_(whole);
}

void ShardedReader::check_pieces() {
  for (const auto& f : manifest_.files) {
    auto& reader = file(f.file);
    for (const auto& piece : f.pieces) {
      const std::string& dtype = manifest_.tensors.at(piece.name).dtype;
      const bool known = reader.has(piece.key);
      const auto info = known ? reader.info(piece.key) : io::SafetensorsRangeReader::TensorInfo{};
      if (!known || io::dtype_name(info.dtype) != dtype ||
          info.numel < piece.key_offset + piece.count) {
        throw CheckpointDamaged(fmt::format("{}/{}: has no {} tensor '{}' of {} elements for '{}'",
                                            dir_, f.file, dtype, piece.key,
                                            piece.key_offset + piece.count, piece.name));
      }
    }
    files_.erase(f.file);  // one file open at a time, whatever the writers' world size
  }
}

int64_t ShardedReader::bytes_read() const { return bytes_read_; }

}  // namespace checkpoint
