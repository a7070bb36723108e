// MappedFile: a whole file mapped read-only (the token shards and the loss masks and document
// boundaries beside them, data/token_shards.h). Pages are read on first touch, so opening a corpus
// costs one mmap per file, whatever its size. And the path queries of src/data/'s readers (what a
// path names, the folder to look for a file beside it). Internal to src/data/.
#pragma once

#include <cstdint>
#include <string>

namespace data {

// True for a path that exists and is a directory, or a regular file (stat(2): no exception,
// symlinks followed; POSIX, not std::filesystem, whose functions the LibTorch wheel's libtorch.so
// exports copies of: tests/common/temp_dir.h).
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
// The folder `path` names, or the folder of the file it names ("." for a bare file name).
std::string folder_of(const std::string& path);

class MappedFile {
 public:
  // Throws DataError naming `path` and `what` (say "token shard") for a file that cannot be
  // opened, is not a regular file (a FIFO is refused, never waited on), or cannot be mapped. An
  // empty file maps to data() == nullptr.
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
