// One token shard on disk and the files beside it, opened and checked: the shard memory-mapped,
// llm.c's header read, NAME.mask, NAME.docs and NAME.pairs checked against it (the formats, and
// what each check refuses: data/token_shards.h). What TokenShardDataset windows; the tokens
// reader's alone. Throws DataError naming the file and the byte offset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "data/mapped_file.h"

namespace data {

// The header of a file beside a shard: 8 bytes of magic, uint32 version, uint32 0, uint64 count,
// uint64 0.
inline constexpr int64_t kSidecarHeaderBytes = 32;

// NAME.bin -> NAME.mask; a shard not named *.bin: its name + ".mask".
std::string sidecar_path(const std::string& shard, const char* extension);

class TokenShard {
 public:
  explicit TokenShard(const std::string& path);

  std::string path;
  MappedFile file;
  int64_t header_bytes = 0;          // before the first token: 0, or llm.c's header
  int64_t width = 2;                 // bytes per token: 2 (uint16), or 4 (uint32, Llama 3's header)
  int64_t count = 0;                 // tokens
  std::unique_ptr<MappedFile> mask;  // NAME.mask, or null: every token is a target
  std::unique_ptr<MappedFile> docs;  // NAME.docs, or null: no document boundaries
  int64_t documents = 0;
  int64_t pairs = -1;  // NAME.pairs' count, or -1: no pairs file

  // Document d's first token (d = documents: the shard's end); with boundaries only.
  int64_t boundary(int64_t d) const;

  // Whether token j is a target the loss counts (checked at open: 0 or 1).
  bool target(int64_t j) const {
    return mask == nullptr || mask->data()[kSidecarHeaderBytes + j] != 0;
  }

  // Targets among tokens [begin, end).
  int64_t targets(int64_t begin, int64_t end) const {
    if (mask == nullptr) return end - begin;
    const unsigned char* m = mask->data() + kSidecarHeaderBytes;
    return std::count(m + begin, m + end, 1);
  }

  // Token j, read as little-endian whatever the host's byte order.
  uint32_t token(int64_t j) const {
    const unsigned char* p = file.data() + header_bytes + width * j;
    if (width == 2) return static_cast<uint32_t>(p[0] | (p[1] << 8));
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  }

  // Every token id below `vocab_size` (Note [Token ids checked at open], token_shard.cpp).
  void check_ids(int64_t vocab_size) const;

 private:
  void read_header(int32_t magic);
  void open_mask();
  void open_docs();
  void open_pairs();
};

}  // namespace data
