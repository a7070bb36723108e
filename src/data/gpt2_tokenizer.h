// Gpt2Tokenizer: GPT-2's byte-level BPE, giving the ids tiktoken's "gpt2" encoding gives
// (encode_ordinary), so prompts and samples line up with shards made by
// scripts/tokenize_text.py --encoding gpt2.
//
// The merge ranks come from a tiktoken-format file (one "base64-token rank" per line, ranks 0 to
// 50255; the bootstrap fetches it as $TRAINER_CACHE/gpt2.tiktoken). Text is cut into pieces by
// GPT-2's pre-tokenizer pattern (PCRE2, UTF + UCP), and each piece is merged by tiktoken's rule:
// the adjacent pair whose concatenation has the lowest rank, leftmost first, until none is a
// token. Ranks are on raw bytes, so no byte-to-unicode table is involved.
//
// Id 50256 is <|endoftext|>: end_of_text(), decoded as the text "<|endoftext|>"; encode() never
// produces it (that text is encoded as ordinary characters). Bytes that are not valid UTF-8 match
// no pattern item; each such run becomes a piece of its own, so decode(encode(t)) == t holds for
// every byte string t.
//
// Known difference from tiktoken: PCRE2 classifies letters and digits by its own Unicode version
// (Debian 12's 10.42: Unicode 14), tiktoken by a newer one, so characters assigned after
// Unicode 14 may be cut differently.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace data {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kEndOfText = 50256;

  // Reads the ranks file. A missing or malformed file is a DataError naming the file (and the
  // line), saying how to get it.
  explicit Gpt2Tokenizer(const std::string& ranks_path);
  ~Gpt2Tokenizer() override;

  std::string name() const override { return "gpt2"; }
  int64_t vocab_size() const override { return kEndOfText + 1; }
  std::optional<int64_t> end_of_text() const override { return kEndOfText; }
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The ranks file make_tokenizer("gpt2") reads: $TRAINER_GPT2_RANKS if set, else
// ${TRAINER_CACHE:-$HOME/.cache/trainer}/gpt2.tiktoken (scripts/env.sh's cache).
std::string gpt2_ranks_path();

}  // namespace data
