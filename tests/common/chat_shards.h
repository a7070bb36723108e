// Token shards with a loss mask and document boundaries beside them (docs/reference.md, "Chat
// data"), written by tests of the data layer and of training on packed documents.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace test {

inline void write_bytes(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

template <class T>
inline void append(std::string& out, T v) {  // little-endian, as the files are (this host is)
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The 32-byte header of a .mask or .docs file.
inline std::string header(const char* magic, uint64_t count, uint32_t version = 1) {
  std::string h(magic, 8);
  append<uint32_t>(h, version);
  append<uint32_t>(h, 0);
  append<uint64_t>(h, count);
  append<uint64_t>(h, 0);
  return h;
}

// A conversation-like document: its tokens and mask.
struct Doc {
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> mask;
};

// BASE.bin (flat uint16), BASE.mask and BASE.docs of `docs`.
inline void write_chat_shard(const std::string& base, const std::vector<Doc>& docs,
                             bool mask = true, bool boundaries = true) {
  std::string tokens, masks, offsets;
  uint64_t at = 0;
  append<uint64_t>(offsets, 0);
  for (const Doc& d : docs) {
    for (const uint16_t t : d.tokens) append(tokens, t);
    masks.append(d.mask.begin(), d.mask.end());
    at += d.tokens.size();
    append<uint64_t>(offsets, at);
  }
  write_bytes(base + ".bin", tokens);
  if (mask) write_bytes(base + ".mask", header("TRAINMSK", at) + masks);
  if (boundaries) write_bytes(base + ".docs", header("TRAINDOC", docs.size()) + offsets);
}

}  // namespace test
