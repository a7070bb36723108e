#include "data/token_shards.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/errors.h"
#include "data/readers.h"

namespace data {
namespace {

// llm.c's headers (dev/data/data_common.py): GPT-2's for uint16 tokens, Llama 3's for uint32.
constexpr int32_t kLlmcMagic16 = 20240520;
constexpr int32_t kLlmcVersion16 = 1;
constexpr int32_t kLlmcMagic32 = 20240801;
constexpr int32_t kLlmcVersion32 = 7;
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The .bin files of `dir`, sorted by name. `key` names the config key for the message.
std::vector<std::string> bin_files(const std::string& dir, const char* key) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw DataError(
        fmt::format("{}: cannot open the directory {}: {}", key, dir, std::strerror(errno)));
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A whole file mapped read-only; unmapped by the destructor. Pages are read on first touch, so
// opening a corpus costs one mmap per shard, whatever its size.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw DataError(
          fmt::format("{}: cannot open the token shard: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw DataError(fmt::format("{}: not a regular file", path));
    }
    bytes_ = static_cast<int64_t>(st.st_size);
    if (bytes_ > 0) {
      void* map = ::mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ, MAP_SHARED, fd, 0);
      if (map == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw DataError(
            fmt::format("{}: cannot map the token shard: {}", path, std::strerror(err)));
      }
      data_ = static_cast<const unsigned char*>(map);
    }
    ::close(fd);  // the mapping keeps the file
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(bytes_));
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  const unsigned char* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace

struct TokenShardDataset::Shard {
  std::string path;
  MappedFile file;
  int64_t header_bytes = 0;  // before the first token: 0, or llm.c's header
  int64_t width = 2;         // bytes per token: 2 (uint16), or 4 (uint32, Llama 3's header)
  int64_t count = 0;         // tokens

  explicit Shard(const std::string& p) : path(p), file(p) {
    const int64_t size = file.bytes();
    if (size == 0) throw DataError(fmt::format("{}: the token shard is empty (0 bytes)", path));
    int32_t magic = 0;
    if (size >= 4) std::memcpy(&magic, file.data(), sizeof magic);
    if (magic == kLlmcMagic16 || magic == kLlmcMagic32) {
      read_header(magic);
    } else if (size % 2 != 0) {
      throw DataError(fmt::format("{}: {} bytes, an odd byte count: not a file of uint16 tokens "
                                  "(a partial token at byte offset {})",
                                  path, size, size - 1));
    } else {
      count = size / width;
    }
  }

  void read_header(int32_t magic) {
    const int64_t size = file.bytes();
    if (size < kLlmcHeaderBytes) {
      throw DataError(fmt::format("{}: truncated: llm.c's header is {} bytes, the file holds {}",
                                  path, kLlmcHeaderBytes, size));
    }
    int32_t header[3];
    std::memcpy(header, file.data(), sizeof header);
    const bool wide = magic == kLlmcMagic32;
    const int32_t version = wide ? kLlmcVersion32 : kLlmcVersion16;
    if (header[1] != version) {
      throw DataError(fmt::format("{}: byte offset 4: llm.c header version {} after magic {}; only "
                                  "version {} ({} tokens) is supported",
                                  path, header[1], magic, version, wide ? "uint32" : "uint16"));
    }
    width = wide ? 4 : 2;
    const int64_t claimed = header[2];
    const int64_t held = (size - kLlmcHeaderBytes) / width;
    if (claimed < 0 || kLlmcHeaderBytes + width * claimed != size) {
      throw DataError(fmt::format("{}: {}: the header (byte offset 8) says {} tokens, the file "
                                  "holds {} ({} bytes after the "
                                  "{}-byte header)",
                                  path, claimed > held ? "truncated" : "corrupt", claimed, held,
                                  size - kLlmcHeaderBytes, kLlmcHeaderBytes));
    }
    header_bytes = kLlmcHeaderBytes;
    count = claimed;
  }

  // Token j, read as little-endian whatever the host's byte order.
  uint32_t token(int64_t j) const {
    const unsigned char* p = file.data() + header_bytes + width * j;
    if (width == 2) return static_cast<uint32_t>(p[0] | (p[1] << 8));
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  }

  // Note [Token ids checked at open]: one pass over the mapped file computes the largest id (a
  // branch-free max the compiler vectorises at -O3: 0.9 s/GB of uint16 on a 2-core machine under a
  // load of 12, a fraction of that idle); only when it is not below the vocabulary does a second
  // pass look for the first offender, for its offset. So get() reads ids it knows are valid, and a
  // bad file stops the run before step 1. Every rank scans every shard it opens (the data layer
  // knows no ranks); the page cache serves the later reads of the same node.
  void check_ids(int64_t vocab_size) const {
    const uint32_t largest = width == 2 ? max_of<uint16_t>() : max_of<uint32_t>();
    if (largest < static_cast<uint64_t>(vocab_size)) return;
    for (int64_t j = 0; j < count; ++j) {
      if (token(j) >= static_cast<uint64_t>(vocab_size)) {
        throw DataError(
            fmt::format("{}: byte offset {}: token id {} is not below data.vocab_size = "
                        "{}",
                        path, header_bytes + width * j, token(j), vocab_size));
      }
    }
  }

  template <class T>
  uint32_t max_of() const {
    const unsigned char* base = file.data() + header_bytes;
    T largest = 0;
    constexpr int64_t kBlock = 4096;
    T block[kBlock];
    for (int64_t j = 0; j < count; j += kBlock) {
      const int64_t n = std::min(kBlock, count - j);
      std::memcpy(block, base + j * static_cast<int64_t>(sizeof(T)), n * sizeof(T));  // alignment
      for (int64_t k = 0; k < n; ++k) largest = std::max(largest, le<T>(block[k]));
    }
    return largest;
  }

  template <class T>
  static T le(T v) {
    if constexpr (std::endian::native == std::endian::little) {
      return v;
    } else if constexpr (sizeof(T) == 2) {
      return __builtin_bswap16(v);
    } else {
      return __builtin_bswap32(v);
    }
  }
};

TokenShardDataset::TokenShardDataset(const std::vector<std::string>& files, int64_t context,
                                     int64_t vocab_size,
                                     const std::vector<std::string>& validation_files)
    : files_(files), context_(context), vocab_size_(vocab_size) {
  if (files.empty()) throw DataError("data.path: no token shards (.bin files) to read");
  if (context < 1) throw DataError(fmt::format("data.context must be positive, got {}", context));
  if (vocab_size < 1)
    throw DataError(fmt::format("data.vocab_size must be positive, got {}", vocab_size));
  const Shard* longest = nullptr;
  for (const auto& f : files) {
    auto shard = std::make_unique<Shard>(f);
    shard->check_ids(vocab_size);
    first_window_.push_back(windows_);
    windows_ += (shard->count - 1) / context;
    tokens_ += shard->count;
    if (longest == nullptr || shard->count > longest->count) longest = shard.get();
    shards_.push_back(std::move(shard));
  }
  if (windows_ == 0) {
    throw DataError(fmt::format(
        "{}: {} tokens, fewer than data.context + 1 = {}: a window longer than the data (windows "
        "never cross shards; {} shard(s), this one the longest)",
        longest->path, longest->count, context + 1, shards_.size()));
  }
  if (!validation_files.empty()) {
    validation_ = std::make_shared<TokenShardDataset>(validation_files, context, vocab_size);
  }
}

TokenShardDataset::~TokenShardDataset() = default;

core::Shape TokenShardDataset::shape() const {
  core::Shape s;
  s.vocab_size = vocab_size_;
  s.context = context_;
  return s;
}

Batch TokenShardDataset::get(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t n = idx.numel();
  const int64_t* ids = idx.data_ptr<int64_t>();
  const int64_t width = context_ + 1;
  at::Tensor window = at::empty({n, width}, at::kLong);
  int64_t* out = window.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = ids[k];
    if (i < 0 || i >= windows_) {
      throw std::out_of_range(fmt::format("token window {} is outside [0, {})", i, windows_));
    }
    // The last shard whose first window is <= i (empty shards share their successor's start).
    const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), i) - 1;
    const Shard& shard = *shards_[static_cast<size_t>(it - first_window_.begin())];
    const int64_t start = (i - *it) * context_;
    for (int64_t j = 0; j < width; ++j)
      out[k * width + j] = shard.token(start + j);  // checked at open
  }
  return {window.narrow(1, 0, context_).contiguous(), window.narrow(1, 1, context_).contiguous()};
}

ShardFiles find_shards(const std::string& path, const std::string& val_path) {
  if (path.empty())
    throw DataError("data.path: empty; give a .bin token shard or a directory of them");
  if (struct stat st{}; ::stat(path.c_str(), &st) != 0) {
    throw DataError(fmt::format("data.path: {}: {} (a .bin token shard or a directory of them)",
                                path, std::strerror(errno)));
  }
  ShardFiles out;
  if (is_directory(path)) {
    for (const auto& name : bin_files(path, "data.path")) {
      (name.find("val") != std::string::npos ? out.validation : out.train)
          .push_back(path + "/" + name);
    }
    if (out.train.empty()) {
      throw DataError(
          fmt::format("data.path: {} holds no training shards (.bin files without 'val' "
                      "in the name)",
                      path));
    }
  } else {
    out.train.push_back(path);
  }
  if (!val_path.empty()) {
    out.validation.clear();
    if (is_directory(val_path)) {
      for (const auto& name : bin_files(val_path, "data.val_path")) {
        out.validation.push_back(val_path + "/" + name);
      }
      if (out.validation.empty()) {
        throw DataError(fmt::format("data.val_path: {} holds no .bin token shards", val_path));
      }
    } else {
      out.validation.push_back(val_path);
    }
  }
  return out;
}

std::unique_ptr<Dataset> make_token_dataset(const DataOptions& o) {
  const ShardFiles files = find_shards(o.path, o.val_path);
  return std::make_unique<TokenShardDataset>(files.train, o.context, o.vocab_size,
                                             files.validation);
}

}  // namespace data
