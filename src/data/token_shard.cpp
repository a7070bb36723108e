#include "data/token_shard.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include <sys/stat.h>

#include "data/errors.h"

namespace data {
namespace {

// llm.c's headers (dev/data/data_common.py): GPT-2's for uint16 tokens, Llama 3's for uint32.
constexpr int32_t kLlmcMagic16 = 20240520;
constexpr int32_t kLlmcVersion16 = 1;
constexpr int32_t kLlmcMagic32 = 20240801;
constexpr int32_t kLlmcVersion32 = 7;
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// The mask and document files beside a shard (token_shards.h; scripts/tokenize_text.py --chat,
// --preference).
constexpr char kMaskMagic[] = "TRAINMSK";
constexpr char kDocsMagic[] = "TRAINDOC";
constexpr char kPairsMagic[] = "TRAINPAR";
constexpr uint32_t kSidecarVersion = 1;

// Whether a sidecar is there: anything but a directory. One that is not a regular file (a FIFO, a
// device) is opened and refused by MappedFile with an error naming it, not skipped as absent.
bool sidecar_there(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

template <class T>
T le(T v) {
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return __builtin_bswap16(v);
  } else if constexpr (sizeof(T) == 4) {
    return __builtin_bswap32(v);
  } else {
    return __builtin_bswap64(v);
  }
}

template <class T>
T read_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // alignment
  return le<T>(v);
}

// The largest of `count` values of type T at `base` (little-endian): a branch-free max the
// compiler vectorises (Note [Token ids checked at open]).
template <class T>
T max_of(const unsigned char* base, int64_t count) {
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

// A mask or document file's header (magic, version): its count.
int64_t sidecar_count(const MappedFile& f, const char* magic, const char* what) {
  if (f.bytes() < kSidecarHeaderBytes) {
    throw DataError(fmt::format("{}: truncated: the {} header is {} bytes, the file holds {}",
                                f.path(), what, kSidecarHeaderBytes, f.bytes()));
  }
  if (std::memcmp(f.data(), magic, 8) != 0) {
    throw DataError(fmt::format("{}: byte offset 0: not a {} file (its first 8 bytes are not '{}')",
                                f.path(), what, magic));
  }
  const auto version = read_le<uint32_t>(f.data() + 8);
  if (version != kSidecarVersion) {
    throw DataError(fmt::format("{}: byte offset 8: {} file version {}; only version {} is read",
                                f.path(), what, version, kSidecarVersion));
  }
  const auto count = read_le<uint64_t>(f.data() + 16);
  if (count > static_cast<uint64_t>(f.bytes())) {
    throw DataError(fmt::format("{}: byte offset 16: the header's count {} is larger than the file",
                                f.path(), count));
  }
  return static_cast<int64_t>(count);
}

}  // namespace

// NAME.bin -> NAME.mask; a shard not named *.bin: its name + ".mask".
std::string sidecar_path(const std::string& shard, const char* extension) {
  const bool bin = shard.size() > 4 && shard.compare(shard.size() - 4, 4, ".bin") == 0;
  return (bin ? shard.substr(0, shard.size() - 4) : shard) + extension;
}

TokenShard::TokenShard(const std::string& p) : path(p), file(p, "token shard") {
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
  open_mask();
  open_docs();
  open_pairs();
}

void TokenShard::read_header(int32_t magic) {
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

// NAME.mask, if there: as many bytes as the shard has tokens, each 0 or 1 (one vectorised pass,
// as for the ids; a second one for the offender's offset only when there is one).
void TokenShard::open_mask() {
  const std::string p = sidecar_path(path, ".mask");
  if (!sidecar_there(p)) return;
  mask = std::make_unique<MappedFile>(p, "loss mask");
  const int64_t n = sidecar_count(*mask, kMaskMagic, "loss mask");
  if (n != count || mask->bytes() != kSidecarHeaderBytes + n) {
    throw DataError(fmt::format(
        "{}: the header (byte offset 16) says {} tokens and {} bytes follow it; its token shard "
        "{} holds {} tokens: they must agree",
        p, n, mask->bytes() - kSidecarHeaderBytes, path, count));
  }
  const unsigned char* m = mask->data() + kSidecarHeaderBytes;
  if (max_of<uint8_t>(m, count) <= 1) return;
  const int64_t j = std::find_if(m, m + count, [](unsigned char v) { return v > 1; }) - m;
  throw DataError(fmt::format("{}: byte offset {}: mask value {} (a mask holds 0 or 1)", p,
                              kSidecarHeaderBytes + j, m[j]));
}

// NAME.docs, if there: count + 1 offsets from 0 to the shard's end, strictly increasing.
void TokenShard::open_docs() {
  const std::string p = sidecar_path(path, ".docs");
  if (!sidecar_there(p)) return;
  docs = std::make_unique<MappedFile>(p, "document boundaries");
  documents = sidecar_count(*docs, kDocsMagic, "document boundaries");
  if (documents < 1 || docs->bytes() != kSidecarHeaderBytes + 8 * (documents + 1)) {
    throw DataError(fmt::format(
        "{}: the header (byte offset 16) says {} documents, which take {} boundaries ({} "
        "bytes after the header); the file holds {} bytes after it",
        p, documents, documents + 1, 8 * (documents + 1), docs->bytes() - kSidecarHeaderBytes));
  }
  int64_t before = -1;
  for (int64_t d = 0; d <= documents; ++d) {
    const int64_t at = boundary(d);
    const int64_t offset = kSidecarHeaderBytes + 8 * d;
    std::string problem;
    if (at < 0 || at > count) {
      problem = fmt::format("is past the end of its token shard {} ({} tokens)", path, count);
    } else if (d == 0 && at != 0) {
      problem = "is the first, which must be 0";
    } else if (d > 0 && at <= before) {
      problem = fmt::format("is not above the one before ({}): boundaries increase", before);
    } else if (d == documents && at != count) {
      problem = fmt::format("is the last, which must be the end of its token shard {} ({} tokens)",
                            path, count);
    }
    if (!problem.empty())
      throw DataError(fmt::format("{}: byte offset {}: boundary {} {}", p, offset, at, problem));
    before = at;
  }
}

// NAME.pairs, if there: the header alone, its count the shard's pairs (documents 2p and 2p + 1
// are pair p's chosen and rejected sequences), so the boundaries must be there and even.
void TokenShard::open_pairs() {
  const std::string p = sidecar_path(path, ".pairs");
  if (!sidecar_there(p)) return;
  const MappedFile header(p, "preference pairs");
  pairs = sidecar_count(header, kPairsMagic, "preference pairs");
  if (docs == nullptr || mask == nullptr) {
    throw DataError(
        fmt::format("{}: preference pairs, but {} has no {} beside it", p, path,
                    docs == nullptr ? "document boundaries (.docs)" : "loss mask (.mask)"));
  }
  if (header.bytes() != kSidecarHeaderBytes || 2 * pairs != documents) {
    throw DataError(fmt::format(
        "{}: the header (byte offset 16) says {} pairs, {} bytes in all; its shard {} holds {} "
        "documents: a pairs file is the 32-byte header, its count half the documents",
        p, pairs, header.bytes(), path, documents));
  }
}

int64_t TokenShard::boundary(int64_t d) const {
  return static_cast<int64_t>(read_le<uint64_t>(docs->data() + kSidecarHeaderBytes + 8 * d));
}

// Note [Token ids checked at open]: one pass over the mapped file computes the largest id (a
// branch-free max the compiler vectorises at -O3: 0.9 s/GB of uint16 on a 2-core machine under a
// load of 12, a fraction of that idle); only when it is not below the vocabulary does a second
// pass look for the first offender, for its offset. So get() reads ids it knows are valid, and a
// bad file stops the run before step 1. Every rank scans every shard it opens (the data layer
// knows no ranks); the page cache serves the later reads of the same node.
void TokenShard::check_ids(int64_t vocab_size) const {
  const unsigned char* base = file.data() + header_bytes;
  const uint32_t largest =
      width == 2 ? max_of<uint16_t>(base, count) : max_of<uint32_t>(base, count);
  if (largest < static_cast<uint64_t>(vocab_size)) return;
  for (int64_t j = 0; j < count; ++j) {
    if (token(j) >= static_cast<uint64_t>(vocab_size)) {
      throw DataError(fmt::format("{}: byte offset {}: token id {} is not below data.vocab_size = "
                                  "{}",
                                  path, header_bytes + width * j, token(j), vocab_size));
    }
  }
}

}  // namespace data
