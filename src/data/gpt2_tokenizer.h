// GPT-2's BPE as tiktoken's "gpt2" encoding (encode_ordinary), read from tiktoken's ranks file
// into the byte-level BPE mechanism (data/bpe_tokenizer.h), so prompts and samples line up with
// shards made by scripts/tokenize_text.py --encoding gpt2.
//
// The ranks file has one "base64-token rank" per line, ranks 0 to 50255; the bootstrap fetches it
// as $TRAINER_CACHE/gpt2.tiktoken. Text is cut by tiktoken's GPT-2 pattern ('$': the end of the
// text), a piece that is a token is that token, and otherwise tiktoken's rule merges: the
// adjacent pair whose concatenation has the lowest rank (leftmost first) -- the BPE mechanism's
// rule with each split of a token into two tokens as a merge of the token's rank. Ranks are on
// raw bytes, so no byte-to-unicode table is involved.
//
// Id 50256 is <|endoftext|>: end_of_text(), decoded as the text "<|endoftext|>"; encode() never
// produces it (that text is encoded as ordinary characters).
//
// Known difference from tiktoken: PCRE2 classifies letters and digits by its own Unicode version
// (Debian 12's 10.42: Unicode 14), tiktoken by a newer one, so characters assigned after
// Unicode 14 may be cut differently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/bpe_tokenizer.h"

namespace data {

inline constexpr int64_t kGpt2EndOfText = 50256;

// Reads the ranks file. A missing or malformed file is a DataError naming the file (and the
// line), saying how to get it.
BpeSpec read_gpt2_ranks(const std::string& ranks_path);

// The ranks file make_tokenizer("gpt2") reads: $TRAINER_GPT2_RANKS if set, else
// ${TRAINER_CACHE:-$HOME/.cache/trainer}/gpt2.tiktoken (scripts/env.sh's cache).
std::string gpt2_ranks_path();

}  // namespace data
