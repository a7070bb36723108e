#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "data/errors.h"

namespace data {
namespace {

// tiktoken's r50k pattern (tiktoken_ext/openai_public.py, the "gpt2" encoding; equivalent to the
// original GPT-2 release's), with \s spelled out as Unicode's White_Space property, which is what
// tiktoken's Rust regex means by \s. PCRE2's \s under UCP also matches U+180E (Mongolian vowel
// separator), which tiktoken treats as a symbol.
constexpr const char* kWhiteSpace =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string gpt2_pattern() {
  const std::string s = kWhiteSpace;
  return R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^)" + s + R"(\p{L}\p{N}]++|[)" + s +
         R"(]++$|[)" + s + R"(]+(?![^)" + s + R"(])|[)" + s + "]";
}

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Pieces longer than this merge through a heap (Impl::merge_long).
constexpr size_t kLongPiece = 64;

// Lets the rank table be searched with string_views of the text, without a copy per lookup.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Decodes standard base64 (with '=' padding); false for anything else.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return false;  // "x=y=" is not padding
    uint32_t group = 0;
    for (int k = 0; k < 4; ++k) {
      const int v = k < 4 - pad ? value(in[i + k]) : 0;
      if (v < 0) return false;
      group = group << 6 | static_cast<uint32_t>(v);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (pad < 2) out.push_back(static_cast<char>(group >> 8 & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(group & 0xFF));
  }
  return true;
}

std::string how_to_get() {
  return "scripts/bootstrap.sh fetches GPT-2's ranks (gpt2.tiktoken) into the cache; "
         "TRAINER_GPT2_RANKS names another copy";
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::unordered_map<std::string, uint32_t, BytesHash, std::equal_to<>> ranks;
  std::vector<std::string> bytes_of;  // id -> its bytes; the last one is <|endoftext|>
  pcre2_code* pattern = nullptr;

  ~Impl() { pcre2_code_free(pattern); }

  uint32_t rank(std::string_view bytes) const {
    const auto it = ranks.find(bytes);
    return it == ranks.end() ? kNoRank : it->second;
  }

  // tiktoken's byte_pair_merge: the adjacent pair of parts whose concatenation has the lowest
  // rank (the leftmost on a tie) merges, until no adjacent pair is a token. Pieces are words,
  // numbers, punctuation or whitespace runs: short ones take the quadratic scan tiktoken does,
  // long ones (a run of thousands of letters) a heap, which merges in the same order.
  void merge(std::string_view piece, std::vector<int64_t>& out) const {
    if (const uint32_t whole = rank(piece); whole != kNoRank) {
      out.push_back(whole);
      return;
    }
    if (piece.size() > kLongPiece) {
      merge_long(piece, out);
      return;
    }
    // bounds: the starts of the parts, then the end; pair[i]: the rank of parts i and i+1 joined.
    std::vector<size_t> bounds(piece.size() + 1);
    for (size_t i = 0; i < bounds.size(); ++i) bounds[i] = i;
    auto pair_rank = [&](size_t i) {
      return i + 2 < bounds.size() ? rank(piece.substr(bounds[i], bounds[i + 2] - bounds[i]))
                                   : kNoRank;
    };
    std::vector<uint32_t> pair(piece.size() - 1);
    for (size_t i = 0; i < pair.size(); ++i) pair[i] = pair_rank(i);
    while (!pair.empty()) {
      size_t best = 0;
      for (size_t i = 1; i < pair.size(); ++i) {
        if (pair[i] < pair[best]) best = i;
      }
      if (pair[best] == kNoRank) break;
      bounds.erase(bounds.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      pair.erase(pair.begin() + static_cast<std::ptrdiff_t>(best));
      if (best < pair.size()) pair[best] = pair_rank(best);
      if (best > 0) pair[best - 1] = pair_rank(best - 1);
    }
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      out.push_back(rank(piece.substr(bounds[i], bounds[i + 1] - bounds[i])));
    }
  }

  // The same merges in O(n log n): parts are a linked list by start offset, candidate pairs sit in
  // a min-heap by (rank, start) -- the leftmost lowest rank, as the scan picks -- and an entry is
  // stale once its pair's extent [start, end) no longer matches two adjacent parts.
  void merge_long(std::string_view piece, std::vector<int64_t>& out) const {
    const size_t n = piece.size();
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    std::vector<size_t> next(n), prev(n);  // indexed by a part's start; next is n at the end
    for (size_t i = 0; i < n; ++i) {
      next[i] = i + 1;
      prev[i] = i == 0 ? kNone : i - 1;
    }
    auto pair_end = [&](size_t i) { return next[i] < n ? next[next[i]] : kNone; };
    using Entry = std::tuple<uint32_t, size_t, size_t>;  // rank, start, end
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    auto push = [&](size_t i) {
      const size_t end = pair_end(i);
      if (end == kNone) return;
      if (const uint32_t r = rank(piece.substr(i, end - i)); r != kNoRank) heap.emplace(r, i, end);
    };
    for (size_t i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const auto [r, i, end] = heap.top();
      heap.pop();
      if (!alive[i] || pair_end(i) != end) continue;
      const size_t j = next[i];
      alive[j] = false;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      push(i);
      if (prev[i] != kNone) push(prev[i]);
    }
    for (size_t i = 0; i < n; i = next[i]) out.push_back(rank(piece.substr(i, next[i] - i)));
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& ranks_path) : impl_(std::make_unique<Impl>()) {
  std::ifstream in(ranks_path, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("{}: cannot read GPT-2's BPE ranks ({})", ranks_path, how_to_get()));
  }
  auto bad = [&](int64_t line, const std::string& what) {
    return DataError(fmt::format("{}:{}: {} (a tiktoken ranks file has lines 'BASE64 RANK' with "
                                 "ranks 0 to {}; {})",
                                 ranks_path, line, what, kEndOfText - 1, how_to_get()));
  };
  impl_->bytes_of.resize(kEndOfText + 1);
  std::vector<bool> seen(kEndOfText, false);
  std::string line, token;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos) throw bad(n, "no space between the token and its rank");
    if (!base64_decode(std::string_view(line).substr(0, space), token)) {
      throw bad(n, "the token is not base64");
    }
    const std::string rank_text = line.substr(space + 1);
    char* end = nullptr;
    const long rank = std::strtol(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || rank < 0 || rank >= kEndOfText) {
      throw bad(n, fmt::format("rank '{}' is not an integer from 0 to {}", rank_text, kEndOfText - 1));
    }
    if (seen[rank]) throw bad(n, fmt::format("rank {} appears twice", rank));
    if (!impl_->ranks.emplace(token, static_cast<uint32_t>(rank)).second) {
      throw bad(n, "the token appears twice");
    }
    seen[rank] = true;
    impl_->bytes_of[rank] = token;
  }
  if (impl_->ranks.size() != static_cast<size_t>(kEndOfText)) {
    throw bad(n, fmt::format("{} ranks, GPT-2 has {}", impl_->ranks.size(), kEndOfText));
  }
  // Every piece must fall apart into known tokens at worst: each single byte is one.
  for (int b = 0; b < 256; ++b) {
    if (impl_->rank(std::string(1, static_cast<char>(b))) == kNoRank) {
      throw bad(n, fmt::format("no token for the single byte {}", b));
    }
  }
  impl_->bytes_of[kEndOfText] = "<|endoftext|>";

  const std::string pattern = gpt2_pattern();
  int err = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing instead of failing the match;
  // DOLLAR_ENDONLY: '$' is the end of the text only, as in tiktoken's regex.
  impl_->pattern = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                     PCRE2_DOLLAR_ENDONLY,
                                 &err, &offset, nullptr);
  if (impl_->pattern == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(err, message, sizeof message);
    throw std::logic_error(fmt::format("GPT-2 pattern does not compile at {}: {}", offset,
                                       reinterpret_cast<const char*>(message)));
  }
  // The JIT is several times faster; where it is unavailable pcre2_match interprets.
  pcre2_jit_compile(impl_->pattern, PCRE2_JIT_COMPLETE);
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::vector<int64_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(impl_->pattern, nullptr), &pcre2_match_data_free);
  if (!match) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->pattern, subject, text.size(), pos, 0, match.get(), nullptr);
    size_t start = text.size(), end = text.size();
    if (rc >= 0) {
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      start = ovector[0];
      end = ovector[1];
    } else if (rc != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw std::runtime_error(fmt::format("gpt2 tokenizer: matching at byte {}: {}", pos,
                                           reinterpret_cast<const char*>(message)));
    }
    if (start > pos) impl_->merge(text.substr(pos, start - pos), ids);  // bytes that are not UTF-8
    if (end == start && rc >= 0) {
      throw std::logic_error("gpt2 tokenizer: the pattern matched an empty piece");
    }
    if (end > start) impl_->merge(text.substr(start, end - start), ids);
    pos = end;
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range(
          fmt::format("gpt2 tokenizer: id {} is outside the vocabulary (0..{})", id, kEndOfText));
    }
    text += impl_->bytes_of[static_cast<size_t>(id)];
  }
  return text;
}

std::string gpt2_ranks_path() {
  if (const char* path = std::getenv("TRAINER_GPT2_RANKS"); path != nullptr && *path != '\0') {
    return path;
  }
  if (const char* cache = std::getenv("TRAINER_CACHE"); cache != nullptr && *cache != '\0') {
    return std::string(cache) + "/gpt2.tiktoken";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") + "/.cache/trainer/gpt2.tiktoken";
}

}  // namespace data
