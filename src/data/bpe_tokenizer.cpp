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

namespace data {
namespace {

// Unicode's White_Space property: what Oniguruma's and Rust regex's \s match.
constexpr const char* kWhiteSpace =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Lets maps keyed by bytes be searched with string_views of the text.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

uint64_t pair_key(int64_t left, int64_t right) {
  return static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right);
}

struct PatternDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Pattern = std::unique_ptr<pcre2_code, PatternDeleter>;

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof message);
  return reinterpret_cast<const char*>(message);
}

Pattern compile(const BpeSpec::Split& split, const std::string& source) {
  const std::string pattern = spell_out_white_space(split.pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing instead of failing the match.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                           (split.multiline ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY);
  Pattern code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), options,
                             &err, &offset, nullptr));
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
  std::unordered_map<std::string, int64_t, BytesHash, std::equal_to<>> id_of;  // bytes -> id
  std::unordered_map<uint64_t, std::pair<uint32_t, int64_t>> merge_of;         // pair -> rank, id
  int64_t byte_id[256] = {};
  std::vector<Pattern> patterns;
  std::vector<std::optional<std::string>> spelled;  // id -> what decode writes
  // Per pass, per first byte: the added tokens starting with it, longest first.
  std::vector<std::array<std::vector<const BpeSpec::AddedToken*>, 256>> added_by_byte;

  std::optional<std::pair<uint32_t, int64_t>> merge(int64_t left, int64_t right) const {
    const auto it = merge_of.find(pair_key(left, right));
    if (it == merge_of.end()) return std::nullopt;
    return it->second;
  }

  void merge_piece(std::string_view piece, std::vector<int64_t>& out) const;
  void pre_tokenize(std::string_view text, std::vector<int64_t>& out) const;
  void split(std::string_view text, size_t step, std::vector<int64_t>& out) const;
  void cut(std::string_view text, size_t step, std::vector<int64_t>& out) const;
  void encode_added(std::string_view text, size_t pass, std::vector<int64_t>& out) const;
};

// The `tokenizers` BPE model's merge loop (lowest rank first, then leftmost): symbols are a linked
// list by start offset; heap entries are (rank, position, merged id) and one is stale when the
// pair at its position no longer merges into that id.
void BpeTokenizer::Impl::merge_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (spec.whole_piece_first) {
    if (const auto it = id_of.find(piece); it != id_of.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const size_t n = piece.size();
  std::vector<int64_t> symbol(n);
  for (size_t i = 0; i < n; ++i) symbol[i] = byte_id[static_cast<unsigned char>(piece[i])];
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

// Cuts `text` with pattern `step` (matches and the gaps between them), passing each piece to the
// next pattern, and after the last to the merges.
void BpeTokenizer::Impl::split(std::string_view text, size_t step,
                               std::vector<int64_t>& out) const {
  if (text.empty()) return;
  if (step == patterns.size()) {
    merge_piece(text, out);
    return;
  }
  if (spec.splits[step].add_prefix_space && text.front() != ' ') {
    std::string spaced(1, ' ');
    spaced.append(text);
    cut(spaced, step, out);
  } else {
    cut(text, step, out);
  }
}

// split()'s cutting, once the prefix space is settled.
void BpeTokenizer::Impl::cut(std::string_view text, size_t step, std::vector<int64_t>& out) const {
  const pcre2_code* code = patterns[step].get();
  if (code == nullptr) {
    split(text, step + 1, out);
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
    split(text.substr(gap, start - gap), step + 1, out);
    split(text.substr(start, end - start), step + 1, out);
    pos = gap = end;
  }
  split(text.substr(gap), step + 1, out);
}

void BpeTokenizer::Impl::pre_tokenize(std::string_view text, std::vector<int64_t>& out) const {
  split(text, 0, out);
}

// Splits out the added tokens of pass `pass`, leftmost-longest, and hands the text between them to
// the next pass (after the last: the pre-tokenizer).
void BpeTokenizer::Impl::encode_added(std::string_view text, size_t pass,
                                      std::vector<int64_t>& out) const {
  if (text.empty()) return;
  if (pass == spec.added_passes.size()) {
    pre_tokenize(text, out);
    return;
  }
  const auto& by_byte = added_by_byte[pass];
  size_t gap = 0;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    for (const auto* t : by_byte[static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, t->content.size(), t->content) != 0) continue;
      encode_added(text.substr(gap, pos - gap), pass + 1, out);
      out.push_back(t->id);
      gap = pos + t->content.size();
      pos = gap - 1;
      break;
    }
  }
  encode_added(text.substr(gap), pass + 1, out);
}

BpeTokenizer::BpeTokenizer(BpeSpec spec) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.spec = std::move(spec);
  const auto& tokens = m.spec.tokens;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id]) m.id_of.emplace(*tokens[id], static_cast<int64_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = m.id_of.find(std::string(1, static_cast<char>(b)));
    if (it == m.id_of.end()) {
      throw DataError(
          fmt::format("{}: no token for the single byte {} (0x{:02X}): a byte-level BPE "
                      "vocabulary holds all 256, or some texts cannot be encoded",
                      m.spec.source, b, b));
    }
    m.byte_id[b] = it->second;
  }
  for (const auto& g : m.spec.merges) {
    m.merge_of.insert_or_assign(pair_key(g.left, g.right), std::make_pair(g.rank, g.merged));
  }
  for (const auto& s : m.spec.splits) {
    m.patterns.push_back(s.pattern.empty() ? nullptr : compile(s, m.spec.source));
  }
  m.spelled = tokens;
  auto spell = [&](const BpeSpec::AddedToken& t) {
    if (t.id < 0)
      throw DataError(fmt::format("{}: added token id {} is negative", m.spec.source, t.id));
    if (static_cast<size_t>(t.id) >= m.spelled.size())
      m.spelled.resize(static_cast<size_t>(t.id) + 1);
    m.spelled[static_cast<size_t>(t.id)] = t.content;
  };
  for (const auto& t : m.spec.unsplit) spell(t);
  for (const auto& pass : m.spec.added_passes) {
    auto& by_byte = m.added_by_byte.emplace_back();
    for (const auto& t : pass) {
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

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::name() const { return impl_->spec.name; }

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->spelled.size()); }

std::optional<int64_t> BpeTokenizer::end_of_text() const { return impl_->spec.end_of_text; }

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3);
  impl_->encode_added(text, 0, ids);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const auto& tokens = impl_->spelled;
  std::string text;
  for (const int64_t id : ids) {
    if (id < 0) {
      throw std::out_of_range(fmt::format("{} tokenizer: id {} is negative", impl_->spec.name, id));
    }
    // An id without a spelling is skipped, as `tokenizers`' decode skips it: a model's vocabulary
    // may be wider than its tokenizer's (Qwen2: 151,936 rows for 151,646 ids) or have holes.
    if (id < vocab_size() && tokens[static_cast<size_t>(id)])
      text += *tokens[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace data
