// BpeTokenizer: byte-level BPE, the one mechanism behind every BPE encoding the trainer reads:
// GPT-2's tiktoken ranks (data/gpt2_tokenizer.h) and any byte-level BPE tokenizer.json (GPT-2,
// Llama 3, SmolLM, Qwen2: data/tokenizer_json.h). A source fills a BpeSpec; this class encodes
// and decodes with it.
//
// encode(text):
//   1. Added tokens are split out first, leftmost-longest, in the spec's passes (the `tokenizers`
//      library matches its non-normalized added tokens on the text, then its normalized ones on
//      what is left); each match is its id.
//   2. What lies between is cut into pieces by the pre-tokenizer: each PCRE2 pattern of `splits`
//      in turn cuts every piece of the previous one (the `tokenizers` Split, behaviour
//      "isolated": matches and the text between them are pieces; empty ones are dropped). Bytes
//      that are not UTF-8 match no pattern and stay pieces of their own.
//   3. Each piece is merged: from its
//      single bytes, the adjacent pair with the lowest merge rank (the leftmost on a tie) is
//      replaced by its merged token, until no adjacent pair is a merge -- the `tokenizers` BPE
//      model's rule; tiktoken's rule is the same with every split of a token as its merge and
//      the token's rank as the merge's rank. With whole_piece_first a piece that is a token is
//      that token at once (tiktoken; `tokenizers`' ignore_merges).
// decode(ids): the bytes of each id, concatenated (an added token is its content); an id with no
// spelling (a hole in the vocabulary, or at or above vocab_size()) is skipped, as `tokenizers`
// skips it; a negative id throws std::out_of_range. vocab_size(): one above the highest id of the
// vocabulary and the added tokens.
//
// Immutable after construction; encode and decode are safe from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace data {

// What a source gives the mechanism. `tokens` is the BPE vocabulary (an empty optional: an id
// it skips); added tokens may take ids inside or beyond it, and decode to their content.
struct BpeSpec {
  struct Merge {
    int64_t left = 0, right = 0, merged = 0;  // ids
    uint32_t rank = 0;                        // lower merges first
  };
  // A pre-tokenizer step: its pattern (empty: cuts nothing) and how to compile it: `tokenizers`
  // (Oniguruma, Ruby syntax) reads '^' and '$' at line ends (PCRE2_MULTILINE); tiktoken (Rust
  // regex) at the text's ends only. add_prefix_space: a piece entering the step that does not
  // start with a space gets one first (`tokenizers`' ByteLevel, piece by piece).
  struct Split {
    std::string pattern;
    bool multiline = false;
    bool add_prefix_space = false;
  };
  struct AddedToken {
    std::string content;
    int64_t id = 0;
  };

  std::string name;                                // as make_tokenizer takes it
  std::string source;                              // the file, for messages
  std::vector<std::optional<std::string>> tokens;  // id -> its bytes
  std::vector<Merge> merges;                       // a later duplicate pair wins
  std::vector<Split> splits;                       // applied in order
  bool whole_piece_first = false;
  std::vector<std::vector<AddedToken>> added_passes;  // split out in this order, before splits
  std::vector<AddedToken> unsplit;  // decoded, never produced by encode (tiktoken's special)
  std::optional<int64_t> end_of_text;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws DataError naming spec.source for a spec that cannot encode every text (a single byte
  // without a token) or a pattern PCRE2 does not compile.
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
