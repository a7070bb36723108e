#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "data/errors.h"
#include "data/text_steps.h"

namespace data {

// The types of BpeTokenizer::Impl's fields. Not in the anonymous namespace: in a unity batch this
// file is not the main file, and a class with a member of an anonymous namespace's type defined
// outside the main file is GCC's -Wsubobject-linkage.
namespace bpe_detail {

// Lets maps keyed by bytes be searched with string_views of the text.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct PatternDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Pattern = std::unique_ptr<pcre2_code, PatternDeleter>;

}  // namespace bpe_detail

namespace {

// Unicode's White_Space property: what Oniguruma's and Rust regex's \s match.
constexpr const char* kWhiteSpace =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

uint64_t pair_key(int64_t left, int64_t right) {
  return static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right);
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof message);
  return reinterpret_cast<const char*>(message);
}

bpe_detail::Pattern compile(const BpeSpec::Split& split, const std::string& source) {
  const std::string pattern = spell_out_white_space(split.pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing instead of failing the match.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                           (split.multiline ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY);
  bpe_detail::Pattern code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()),
                                         pattern.size(), options, &err, &offset, nullptr));
  if (!code) {
    throw DataError(fmt::format("{}: the pre-tokenizer pattern {} does not compile (PCRE2, at "
                                "character {}: {})",
                                source, split.pattern, offset, pcre2_message(err)));
  }
  // The JIT is several times faster; where it is unavailable pcre2_match interprets.
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  return code;
}

// Length of the UTF-8 sequence starting at text[pos] (1 for a byte that starts none).
size_t char_length(std::string_view text, size_t pos) {
  const auto c = static_cast<unsigned char>(text[pos]);
  const size_t n = c < 0x80 ? 1 : c >> 5 == 0x6 ? 2 : c >> 4 == 0xE ? 3 : c >> 3 == 0x1E ? 4 : 1;
  return std::min(n, text.size() - pos);
}

}  // namespace

std::string spell_out_white_space(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : fmt::format("[{}]", kWhiteSpace);
      } else if (e == 'S' && !in_class) {
        out += fmt::format("[^{}]", kWhiteSpace);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct BpeTokenizer::Impl {
  BpeSpec spec;
  std::unordered_map<std::string, int64_t, bpe_detail::BytesHash, std::equal_to<>>
      id_of;                                                            // spelling -> id
  std::unordered_map<uint64_t, std::pair<uint32_t, int64_t>> merge_of;  // pair -> rank, id
  int64_t byte_id[256] = {};  // kBytes: each byte's token; kCharacters: its <0xNN> token, or -1
  std::vector<bpe_detail::Pattern> patterns;
  std::vector<std::optional<std::string>> spelled;  // id -> what decode starts from
  // The added tokens (as given, normalized) by their first byte, longest first.
  std::array<std::array<std::vector<const BpeSpec::AddedToken*>, 256>, 2> added_by_byte;

  std::optional<std::pair<uint32_t, int64_t>> merge(int64_t left, int64_t right) const {
    const auto it = merge_of.find(pair_key(left, right));
    if (it == merge_of.end()) return std::nullopt;
    return it->second;
  }

  void index_tokens();
  void index_added();
  std::vector<int64_t> first_symbols(std::string_view piece) const;
  void merge_piece(std::string_view piece, std::vector<int64_t>& out) const;
  void split(std::string_view text, size_t step, bool at_start, std::vector<int64_t>& out) const;
  void cut(std::string_view text, size_t step, bool at_start, std::vector<int64_t>& out) const;
  void encode_added(std::string_view text, size_t pass, bool at_start,
                    std::vector<int64_t>& out) const;
};

// A piece's symbols before any merge: its bytes' tokens (kBytes), or its characters' tokens, a
// character without one falling back to its bytes' <0xNN> tokens, else to the unknown token --
// `tokenizers`' BPE::merge_word, whose pending unknown token waits for the next character with a
// token (or the end), even past a fallback.
std::vector<int64_t> BpeTokenizer::Impl::first_symbols(std::string_view piece) const {
  std::vector<int64_t> symbols;
  symbols.reserve(piece.size());
  if (spec.symbols == BpeSpec::Symbols::kBytes) {
    for (const char c : piece) symbols.push_back(byte_id[static_cast<unsigned char>(c)]);
    return symbols;
  }
  bool unknown_pending = false;
  for (size_t pos = 0; pos < piece.size();) {
    const size_t n = std::max<size_t>(utf8_length(piece, pos), 1);
    const std::string_view c = piece.substr(pos, n);
    pos += n;
    if (const auto it = id_of.find(c); it != id_of.end()) {
      if (unknown_pending) symbols.push_back(*spec.unknown);
      unknown_pending = false;
      symbols.push_back(it->second);
      continue;
    }
    if (spec.byte_fallback && std::all_of(c.begin(), c.end(), [&](char b) {
          return byte_id[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (const char b : c) symbols.push_back(byte_id[static_cast<unsigned char>(b)]);
      continue;
    }
    if (!spec.unknown) continue;  // `tokenizers` drops the character
    if (unknown_pending && !spec.fuse_unknown) symbols.push_back(*spec.unknown);
    unknown_pending = true;
  }
  if (unknown_pending) symbols.push_back(*spec.unknown);
  return symbols;
}

// The `tokenizers` BPE model's merge loop (lowest rank first, then leftmost): symbols are a linked
// list by position; heap entries are (rank, position, merged id) and one is stale when the pair at
// its position no longer merges into that id.
void BpeTokenizer::Impl::merge_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (spec.whole_piece_first) {
    if (const auto it = id_of.find(piece); it != id_of.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> symbol = first_symbols(piece);
  const size_t n = symbol.size();
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<size_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n: the end
    prev[i] = i == 0 ? kNone : i - 1;
  }
  using Entry = std::tuple<uint32_t, size_t, int64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push = [&](size_t i) {
    if (next[i] >= n) return;
    if (const auto m = merge(symbol[i], symbol[next[i]])) heap.emplace(m->first, i, m->second);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    const auto [rank, i, merged] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] >= n) continue;
    const auto now = merge(symbol[i], symbol[next[i]]);
    if (!now || now->second != merged) continue;
    const size_t j = next[i];
    symbol[i] = merged;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    if (prev[i] != kNone) push(prev[i]);
    push(i);
  }
  for (size_t i = 0; i < n; i = next[i]) out.push_back(symbol[i]);
}

// Rewrites `text` as step `step` says (spaces, prefix), then cuts it with the step's pattern,
// passing each piece to the next step, and after the last to the merges. `at_start`: the text
// begins where the whole text did.
void BpeTokenizer::Impl::split(std::string_view text, size_t step, bool at_start,
                               std::vector<int64_t>& out) const {
  if (text.empty()) return;
  if (step == patterns.size()) {
    merge_piece(text, out);
    return;
  }
  const BpeSpec::Split& s = spec.splits[step];
  std::string changed;
  std::string_view piece = text;
  if (!s.space_as.empty() && piece.find(' ') != std::string_view::npos) {
    changed = piece;
    replace_all(changed, " ", s.space_as);
    piece = changed;
  }
  if (!s.prefix.empty() && (at_start || !s.prefix_first_only) && !piece.starts_with(s.prefix)) {
    changed = s.prefix + std::string(piece);
    piece = changed;
  }
  cut(piece, step, at_start, out);
}

// split()'s cutting, once the piece is rewritten.
void BpeTokenizer::Impl::cut(std::string_view text, size_t step, bool at_start,
                             std::vector<int64_t>& out) const {
  const pcre2_code* code = patterns[step].get();
  if (code == nullptr) {
    split(text, step + 1, at_start, out);
    return;
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  if (!match) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap = 0;  // gap: where the text not yet passed on begins
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw std::runtime_error(
          fmt::format("{} tokenizer: matching at byte {}: {}", spec.name, pos, pcre2_message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match cuts nothing: look again one character on
      pos = start + char_length(text, start);
      continue;
    }
    switch (spec.splits[step].match) {
      case BpeSpec::Split::Match::kIsolated:
        split(text.substr(gap, start - gap), step + 1, at_start && gap == 0, out);
        split(text.substr(start, end - start), step + 1, at_start && start == 0, out);
        gap = end;
        break;
      case BpeSpec::Split::Match::kWithPrevious:
        split(text.substr(gap, end - gap), step + 1, at_start && gap == 0, out);
        gap = end;
        break;
      case BpeSpec::Split::Match::kWithNext:
        split(text.substr(gap, start - gap), step + 1, at_start && gap == 0, out);
        gap = start;
        break;
    }
    pos = end;
  }
  split(text.substr(gap), step + 1, at_start && gap == 0, out);
}

// Splits out the added tokens of pass `pass` (0: as given, 1: normalized), leftmost-longest, and
// hands the text between them on: after pass 0 through the normalizer to pass 1, after pass 1 to
// the pre-tokenizer.
void BpeTokenizer::Impl::encode_added(std::string_view text, size_t pass, bool at_start,
                                      std::vector<int64_t>& out) const {
  if (text.empty()) return;
  auto hand_on = [&](std::string_view between, bool first) {
    if (pass == 1) {
      split(between, 0, first, out);
    } else if (spec.normalizer.empty()) {
      encode_added(between, 1, first, out);
    } else {
      encode_added(normalize(between, spec.normalizer), 1, first, out);
    }
  };
  const auto& by_byte = added_by_byte[pass];
  size_t gap = 0;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    for (const auto* t : by_byte[static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, t->content.size(), t->content) != 0) continue;
      hand_on(text.substr(gap, pos - gap), at_start && gap == 0);
      out.push_back(t->id);
      gap = pos + t->content.size();
      pos = gap - 1;
      break;
    }
  }
  hand_on(text.substr(gap), at_start && gap == 0);
}

void BpeTokenizer::Impl::index_tokens() {
  const auto& tokens = spec.tokens;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id]) id_of.emplace(*tokens[id], static_cast<int64_t>(id));
  }
  const bool bytes = spec.symbols == BpeSpec::Symbols::kBytes;
  for (int b = 0; b < 256; ++b) {
    const auto it =
        id_of.find(bytes ? std::string(1, static_cast<char>(b)) : fmt::format("<0x{:02X}>", b));
    byte_id[b] = it == id_of.end() ? -1 : it->second;
    if (bytes && byte_id[b] < 0) {
      throw DataError(
          fmt::format("{}: no token for the single byte {} (0x{:02X}): a byte-level BPE "
                      "vocabulary holds all 256, or some texts cannot be encoded",
                      spec.source, b, b));
    }
  }
  if (spec.unknown && !(*spec.unknown >= 0 && static_cast<size_t>(*spec.unknown) < tokens.size() &&
                        tokens[static_cast<size_t>(*spec.unknown)])) {
    throw DataError(fmt::format("{}: the unknown token's id {} is not in the vocabulary",
                                spec.source, *spec.unknown));
  }
  for (const auto& g : spec.merges) {
    merge_of.insert_or_assign(pair_key(g.left, g.right), std::make_pair(g.rank, g.merged));
  }
  for (const auto& s : spec.splits) {
    patterns.push_back(s.pattern.empty() ? nullptr : compile(s, spec.source));
  }
}

void BpeTokenizer::Impl::index_added() {
  spelled = spec.tokens;
  auto spell = [&](const BpeSpec::AddedToken& t) {
    if (t.id < 0)
      throw DataError(fmt::format("{}: added token id {} is negative", spec.source, t.id));
    if (static_cast<size_t>(t.id) >= spelled.size()) spelled.resize(static_cast<size_t>(t.id) + 1);
    spelled[static_cast<size_t>(t.id)] = t.content;
  };
  for (const auto& t : spec.unsplit) spell(t);
  const std::vector<BpeSpec::AddedToken>* passes[2] = {&spec.added, &spec.added_normalized};
  for (size_t pass = 0; pass < 2; ++pass) {
    auto& by_byte = added_by_byte[pass];
    for (const auto& t : *passes[pass]) {
      spell(t);
      if (!t.content.empty()) by_byte[static_cast<unsigned char>(t.content[0])].push_back(&t);
    }
    for (auto& list : by_byte) {
      std::stable_sort(list.begin(), list.end(), [](const auto* a, const auto* b) {
        return a->content.size() > b->content.size();
      });
    }
  }
}

BpeTokenizer::BpeTokenizer(BpeSpec spec) : impl_(std::make_unique<Impl>()) {
  impl_->spec = std::move(spec);
  impl_->index_tokens();
  impl_->index_added();
}

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::name() const { return impl_->spec.name; }

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->spelled.size()); }

std::optional<int64_t> BpeTokenizer::end_of_text() const { return impl_->spec.end_of_text; }

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3);
  impl_->encode_added(text, 0, true, ids);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const auto& tokens = impl_->spelled;
  std::vector<std::string> spellings;
  for (const int64_t id : ids) {
    if (id < 0) {
      throw std::out_of_range(fmt::format("{} tokenizer: id {} is negative", impl_->spec.name, id));
    }
    // An id without a spelling is skipped, as `tokenizers`' decode skips it: a model's vocabulary
    // may be wider than its tokenizer's (Qwen2: 151,936 rows for 151,646 ids) or have holes.
    if (id < vocab_size() && tokens[static_cast<size_t>(id)])
      spellings.push_back(*tokens[static_cast<size_t>(id)]);
  }
  decode_steps(impl_->spec.decoder, spellings);
  std::string text;
  for (const auto& s : spellings) text += s;
  return text;
}

}  // namespace data
