#include "data/gpt2_tokenizer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include "data/errors.h"

namespace data {
namespace {

// tiktoken's r50k pattern (tiktoken_ext/openai_public.py, the "gpt2" encoding; equivalent to the
// original GPT-2 release's); \s is spelled out by the BPE mechanism as Unicode's White_Space.
constexpr const char* kGpt2Pattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";

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
  return "scripts/bootstrap.sh --dev fetches GPT-2's ranks (gpt2.tiktoken) into the cache; "
         "TRAINER_GPT2_RANKS names another copy";
}

}  // namespace

BpeSpec read_gpt2_ranks(const std::string& ranks_path) {
  std::ifstream in(ranks_path, std::ios::binary);
  if (!in) {
    throw DataError(
        fmt::format("{}: cannot read GPT-2's BPE ranks ({})", ranks_path, how_to_get()));
  }
  auto bad = [&](int64_t line, const std::string& what) {
    return DataError(fmt::format("{}:{}: {} (a tiktoken ranks file has lines 'BASE64 RANK' with "
                                 "ranks 0 to {}; {})",
                                 ranks_path, line, what, kGpt2EndOfText - 1, how_to_get()));
  };
  BpeSpec spec;
  spec.name = "gpt2";
  spec.source = ranks_path;
  spec.tokens.resize(kGpt2EndOfText);
  std::unordered_map<std::string, int64_t> id_of;
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
    if (rank_text.empty() || *end != '\0' || rank < 0 || rank >= kGpt2EndOfText) {
      throw bad(n, fmt::format("rank '{}' is not an integer from 0 to {}", rank_text,
                               kGpt2EndOfText - 1));
    }
    if (spec.tokens[rank]) throw bad(n, fmt::format("rank {} appears twice", rank));
    if (!id_of.emplace(token, rank).second) throw bad(n, "the token appears twice");
    spec.tokens[rank] = token;
  }
  if (id_of.size() != static_cast<size_t>(kGpt2EndOfText)) {
    throw bad(n, fmt::format("{} ranks, GPT-2 has {}", id_of.size(), kGpt2EndOfText));
  }
  // tiktoken's rule as merges: every split of a token into two tokens merges at the token's rank.
  for (int64_t id = 0; id < kGpt2EndOfText; ++id) {
    const std::string& t = *spec.tokens[id];
    for (size_t k = 1; k < t.size(); ++k) {
      const auto left = id_of.find(t.substr(0, k));
      const auto right = id_of.find(t.substr(k));
      if (left != id_of.end() && right != id_of.end()) {
        spec.merges.push_back({left->second, right->second, id, static_cast<uint32_t>(id)});
      }
    }
  }
  // multiline false: '$' is the end of the text, as in tiktoken.
  spec.splits.emplace_back().pattern = kGpt2Pattern;
  spec.whole_piece_first = true;
  spec.unsplit.push_back({"<|endoftext|>", kGpt2EndOfText});
  spec.end_of_text = kGpt2EndOfText;
  return spec;
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
