// The text steps around a BPE model, as the `tokenizers` library runs them: the normalizer's on the
// text between added tokens (Prepend, Replace), and the decoder's on the list of the ids'
// spellings (Replace, ByteFallback, Fuse, Strip, Metaspace); and the UTF-8 rule they and the BPE
// mechanism (data/bpe_tokenizer.h) share. Pure functions of their arguments.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace data {

// A normalizer step: every `from` becomes `to` (Replace), or with `from` empty, `to` goes in front
// of a text that is not empty (Prepend).
struct Rewrite {
  std::string from, to;
};

// A decoder step, on the list of the ids' spellings, as `tokenizers`' decoder of that name:
//   kReplace       every `from` in each becomes `to`
//   kByteFallback  a run of <0xNN> tokens becomes its bytes: one spelling if they are UTF-8, else
//                  one per byte (where `tokenizers` writes U+FFFD, so that decoding is byte for
//                  byte)
//   kFuse          all spellings become one
//   kStrip         each loses up to `start` leading and `stop` trailing `from` (one character)
//   kMetaspace     `from` (the replacement) becomes ' ' in each, or is dropped from the first with
//                  start 1 (a prepend_scheme other than never)
struct DecodeStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from, to;
  size_t start = 0, stop = 0;
};

// `text` through the normalizer steps, in order.
std::string normalize(std::string_view text, const std::vector<Rewrite>& steps);

// The spellings through the decoder steps, in order.
void decode_steps(const std::vector<DecodeStep>& steps, std::vector<std::string>& spellings);

// Length of the UTF-8 character starting at text[pos]; 0 where none does (a byte that is not UTF-8:
// a lone continuation byte, a truncated or overlong sequence, a surrogate, above U+10FFFF).
size_t utf8_length(std::string_view text, size_t pos);

// Every `from` in `text` becomes `to`, left to right, matches not overlapping.
void replace_all(std::string& text, std::string_view from, std::string_view to);

}  // namespace data
