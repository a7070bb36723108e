#include "data/text_steps.h"

#include <optional>

namespace data {
namespace {

bool valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = utf8_length(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

// The byte a token spelled "<0xNN>" stands for (`tokenizers`' ByteFallback decoder), else none.
std::optional<char> fallback_byte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  int value = 0;
  for (const char c : token.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<char>(value);
}

// `tokenizers`' decoders, each a step on the list of spellings (DecodeStep).
void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  auto flush = [&] {
    if (valid_utf8(run)) {
      if (!run.empty()) out.push_back(run);
    } else {
      for (const char c : run) out.emplace_back(1, c);
    }
    run.clear();
  };
  for (auto& t : tokens) {
    if (const auto byte = fallback_byte(t)) {
      run.push_back(*byte);
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  tokens = std::move(out);
}

void strip(std::string& token, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0, end = token.size();
  for (size_t k = 0; k < start && token.compare(begin, c.size(), c) == 0; ++k) begin += c.size();
  for (size_t k = 0;
       k < stop && end >= begin + c.size() && token.compare(end - c.size(), c.size(), c) == 0;
       ++k) {
    end -= c.size();
  }
  token = token.substr(begin, end - begin);
}

void decode_step(const DecodeStep& step, std::vector<std::string>& tokens) {
  using Kind = DecodeStep::Kind;
  switch (step.kind) {
    case Kind::kReplace:
      for (auto& t : tokens) replace_all(t, step.from, step.to);
      break;
    case Kind::kByteFallback: byte_fallback(tokens); break;
    case Kind::kFuse: {
      std::string whole;
      for (const auto& t : tokens) whole += t;
      tokens.assign(1, std::move(whole));
      break;
    }
    case Kind::kStrip:
      for (auto& t : tokens) strip(t, step.from, step.start, step.stop);
      break;
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        replace_all(tokens[i], step.from, i == 0 && step.start > 0 ? "" : " ");
      }
      break;
  }
}

}  // namespace

// Length of the UTF-8 character starting at text[pos]; 0 where none does (a byte that is not UTF-8:
// a lone continuation byte, a truncated or overlong sequence, a surrogate, above U+10FFFF).
size_t utf8_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[pos + k]); };
  const unsigned char c = byte(0);
  const size_t n = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
  if (n <= 1 || pos + n > text.size()) return n == 1 ? 1 : 0;
  // The second byte's range narrows after E0, ED, F0 and F4 (overlongs, surrogates, the top).
  const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
  if (byte(1) < lo || byte(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return n;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t gap = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, gap)) {
    out.append(text, gap, at - gap).append(to);
    gap = at + from.size();
  }
  if (gap == 0) return;
  out.append(text, gap);
  text = std::move(out);
}

std::string normalize(std::string_view text, const std::vector<Rewrite>& steps) {
  std::string out(text);
  for (const auto& step : steps) {
    if (step.from.empty()) {
      if (!out.empty()) out.insert(0, step.to);
    } else {
      replace_all(out, step.from, step.to);
    }
  }
  return out;
}

void decode_steps(const std::vector<DecodeStep>& steps, std::vector<std::string>& spellings) {
  for (const auto& step : steps) decode_step(step, spellings);
}

}  // namespace data
