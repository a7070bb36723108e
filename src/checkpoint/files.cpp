#include "checkpoint/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/output_dir.h"
#include "io/safetensors.h"
#include "io/shard_manifest.h"

namespace checkpoint {

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
      if (format == meta.end() || format->second != kSingleFileFormat) continue;
      const auto step = metadata_number(path, meta, "step");
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
      if (format == meta.end() || format->second != kSingleFileFormat)
        continue;  // not a checkpoint
      step = metadata_number(path, meta, "step");
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

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw CheckpointError(
        fmt::format("cannot move {} into place as {}: {}", from, to, std::strerror(err)), err);
  }
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw CheckpointError(fmt::format("cannot fsync {}: {}", path, std::strerror(err)), err);
  }
  ::close(fd);
}

bool is_sharded_checkpoint(const std::string& path) {
  struct stat st {};
  return ::stat((path + "/" + io::kShardManifestName).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool remove_step_dir(const std::string& step_dir) {
  // The manifest first: a directory removed halfway is no longer a checkpoint.
  std::remove((step_dir + "/" + io::kShardManifestName).c_str());
  for (const auto& name : files_in(step_dir)) std::remove((step_dir + "/" + name).c_str());
  return ::rmdir(step_dir.c_str()) == 0;
}

}  // namespace checkpoint
