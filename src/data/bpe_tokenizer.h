// BpeTokenizer: BPE, the one mechanism behind every BPE encoding the trainer reads: GPT-2's
// tiktoken ranks (data/gpt2_tokenizer.h), byte-level BPE tokenizer.json files (GPT-2, Llama 3,
// SmolLM, Qwen2) and SentencePiece-style ones (Llama 2, Mistral: BPE on characters with byte
// fallback, data/tokenizer_json.h). A source fills a BpeSpec; this class encodes and decodes with
// it, as the `tokenizers` library's Tokenizer does.
//
// encode(text):
//   1. The added tokens of `added` are split out first, leftmost-longest; each match is its id.
//   2. Each text between them goes through the `normalizer` (Prepend, Replace), and then the
//      tokens of `added_normalized` (whose content is normalized alike) are split out of it.
//   3. What lies between is cut into pieces by the pre-tokenizer: each step of `splits` in turn
//      rewrites every piece of the previous one (spaces as Metaspace's replacement, a prefix) and
//      cuts it with its PCRE2 pattern (the `tokenizers` Split: with behaviour "isolated", matches
//      and the text between them are pieces; "merged with previous" or "next", a match joins the
//      text on that side; empty pieces are dropped). Bytes that are not UTF-8 match no pattern.
//   4. Each piece is split into its first symbols (`symbols`: its bytes, or its characters, a
//      character the vocabulary lacks as the tokens <0xNN> of its bytes with byte_fallback, else
//      `unknown`; a byte that is not UTF-8 is a character of its own) and merged: the adjacent
//      pair with the lowest merge rank (the leftmost on a tie) is replaced by its merged token,
//      until no adjacent pair is a merge -- the `tokenizers` BPE model's rule; tiktoken's rule is
//      the same with every split of a token as its merge and the token's rank as the merge's
//      rank. With whole_piece_first a piece that is a token is that token at once (tiktoken;
//      `tokenizers`' ignore_merges).
// decode(ids): the spelling of each id (an added token's is its content) through the `decoder`
// steps, concatenated; without steps the spellings are the tokens' bytes. The ByteFallback step
// writes a <0xNN> token as the byte itself, so decode(encode(text)) is text byte for byte where
// `tokenizers` writes U+FFFD for bytes that are not UTF-8. An id with no spelling (a hole in the
// vocabulary, or at or above vocab_size()) is skipped, as `tokenizers` skips it; a negative id
// throws std::out_of_range. vocab_size(): one above the highest id of the vocabulary and the
// added tokens.
//
// Immutable after construction; encode and decode are safe from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/text_steps.h"
#include "data/tokenizer.h"

namespace data {

// What a source gives the mechanism. `tokens` is the BPE vocabulary (an empty optional: an id
// it skips): each token's bytes (byte-level), or its characters as the vocabulary spells them
// (SentencePiece-style: "▁the", "<0x0A>"). Added tokens may take ids inside or beyond it,
// and are spelled by their content.
struct BpeSpec {
  struct Merge {
    int64_t left = 0, right = 0, merged = 0;  // ids
    uint32_t rank = 0;                        // lower merges first
  };
  // A pre-tokenizer step. Before cutting, in each piece: every ' ' becomes space_as (Metaspace's
  // replacement; empty: left as is), then a piece that does not start with `prefix` gets it in
  // front (ByteLevel's add_prefix_space: " "; Metaspace's prepend_scheme always: its
  // replacement), with prefix_first_only only the piece the text starts with (prepend_scheme
  // first). Then its pattern (empty: cuts nothing) cuts it, compiled as `tokenizers` (Oniguruma,
  // Ruby syntax) reads it, '^' and '$' at line ends (PCRE2_MULTILINE), or as tiktoken (Rust
  // regex), at the text's ends only; each match is a piece of its own (`tokenizers`' Split
  // behaviour Isolated), or joins the text before it (MergedWithPrevious) or after it
  // (MergedWithNext).
  struct Split {
    enum class Match { kIsolated, kWithPrevious, kWithNext };
    std::string pattern;
    bool multiline = false;
    Match match = Match::kIsolated;
    std::string space_as;
    std::string prefix;
    bool prefix_first_only = false;
  };
  struct AddedToken {
    std::string content;
    int64_t id = 0;
  };
  // How a piece becomes its first symbols: its bytes, each the token of that byte (byte-level
  // BPE), or its characters (SentencePiece-style).
  enum class Symbols { kBytes, kCharacters };

  std::string name;                                // as make_tokenizer takes it
  std::string source;                              // the file, for messages
  std::vector<std::optional<std::string>> tokens;  // id -> its bytes, or (kCharacters) text
  std::vector<Merge> merges;                       // a later duplicate pair wins
  std::vector<Split> splits;                       // applied in order
  bool whole_piece_first = false;
  Symbols symbols = Symbols::kBytes;
  // kCharacters: a character without a token is the tokens <0xNN> of its bytes (when the
  // vocabulary has them all), else `unknown` (one for a run of them with fuse_unknown), else
  // nothing, as in `tokenizers`.
  bool byte_fallback = false;
  std::optional<int64_t> unknown;
  bool fuse_unknown = false;
  // The normalizer and decoder steps (data/text_steps.h); without decoder steps the spellings are
  // bytes, concatenated.
  std::vector<Rewrite> normalizer;
  std::vector<DecodeStep> decoder;
  std::vector<AddedToken> added;             // split out of the text as given
  std::vector<AddedToken> added_normalized;  // then out of the normalized text; content normalized
  std::vector<AddedToken> unsplit;  // decoded, never produced by encode (tiktoken's special)
  std::optional<int64_t> end_of_text;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws DataError naming spec.source for a byte-level spec that cannot encode every text (a
  // single byte without a token), an unknown id outside the vocabulary or a pattern PCRE2 does not
  // compile.
  explicit BpeTokenizer(BpeSpec spec);
  ~BpeTokenizer() override;

  std::string name() const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> end_of_text() const override;
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "\s" and "\S" of a pattern spelled as the White_Space set that `tokenizers` (Oniguruma) and
// tiktoken (Rust regex) mean by them; PCRE2's \s also matches U+180E. "\S" inside a class stays.
std::string spell_out_white_space(const std::string& pattern);

}  // namespace data
