// MappedFile: a whole file mapped read-only (the token shards and the loss masks and document
// boundaries beside them, data/token_shards.h). Pages are read on first touch, so opening a corpus
// costs one mmap per file, whatever its size. Internal to src/data/.
#pragma once

#include <cstdint>
#include <string>

namespace data {

// True for a path that exists and is a directory (stat(2): no exception, symlinks followed).
bool is_directory(const std::string& path);

class MappedFile {
 public:
  // Throws DataError naming `path` and `what` (say "token shard") for a file that cannot be
  // opened, is not a regular file, or cannot be mapped. An empty file maps to data() == nullptr.
  MappedFile(const std::string& path, const char* what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace data
