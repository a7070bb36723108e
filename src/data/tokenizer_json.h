// Reads a Hugging Face `tokenizer.json` of the BPE kind into the BPE mechanism
// (data/bpe_tokenizer.h), so that encode() gives the ids `tokenizers`' Tokenizer.encode(text,
// add_special_tokens=False) gives: byte-level files (GPT-2, Llama 3, SmolLM, Qwen2 without its
// normalizer), and, without a ByteLevel pre-tokenizer, SentencePiece-style ones (Llama 2,
// Mistral: BPE on characters with byte fallback).
//
// What is read:
//   model          type BPE: vocab (byte-level strings, mapped back to bytes by GPT-2's
//                  byte-to-unicode table; SentencePiece-style: characters), merges ("a b" strings
//                  or [a, b] pairs; the index is the rank), ignore_merges (a piece that is a token
//                  is that token); SentencePiece-style: byte_fallback, unk_token, fuse_unk.
//   normalizer     SentencePiece-style only: Prepend, Replace (a String pattern), Sequences.
//   pre_tokenizer  ByteLevel (add_prefix_space; use_regex: GPT-2's pattern), Metaspace
//                  (replacement, prepend_scheme or the older add_prefix_space, split), Split (a
//                  Regex or String pattern, behaviour Isolated, MergedWithPrevious or
//                  MergedWithNext), Digits, and Sequences of them, ByteLevel last. Patterns
//                  compile with PCRE2, '^' and '$' at line ends as in Oniguruma.
//   decoder        SentencePiece-style only: Replace (a String pattern), ByteFallback, Fuse,
//                  Strip, Metaspace, Sequences (byte-level files decode to their tokens' bytes).
//   added_tokens   split out before the normalizer and pre-tokenization: the non-normalized ones
//                  first, then the normalized ones, matched and spelled as the normalizer writes
//                  them; each decodes to its content. end_of_text() is the added token
//                  <|endoftext|>, else <|end_of_text|>, else none.
// Not applied: the post-processor (a BOS id Llama 3's or Llama 2's template adds) and
// padding/truncation.
//
// Refused with a DataError naming the file and the JSON key: another model type (WordPiece,
// Unigram, WordLevel), a normalizer, pre-tokenizer, Split behaviour or decoder not listed above (a
// normalizer with ByteLevel; a SentencePiece-style file without a decoder), subword prefixes or
// suffixes, dropout, added tokens with lstrip, rstrip or single_word, an unk_token or a merge of
// tokens the vocabulary lacks, and a byte-level vocabulary without every single byte.
#pragma once

#include <string>

#include "data/bpe_tokenizer.h"

namespace data {

BpeSpec read_tokenizer_json(const std::string& path);

// Whether `setting` (data.tokenizer) names a tokenizer.json file rather than an encoding.
bool is_tokenizer_json_path(const std::string& setting);

// The built-in encodings (data/tokenizer.h: bytes, gpt2) as a `tokenizers` tokenizer.json that
// gives every text the same ids: bytes, a byte-level BPE of the 256 bytes without merges; gpt2,
// GPT-2's vocabulary with tiktoken's rule as merges (each split of a token into two tokens, at
// the token's rank, as data/gpt2_tokenizer.h reads them; ignore_merges: a piece that is a token is
// that token), GPT-2's pattern, and <|endoftext|> (50256) as a special added token. --export-hf
// writes it beside the weights (launcher/serving_files.h). std::invalid_argument for another
// name; gpt2: the DataError of a ranks file that cannot be read.
std::string builtin_tokenizer_json(const std::string& encoding);

// The tokenizer.json beside model.init_from's weights (in the directory it names, or beside the
// file it names); "" when there is none.
std::string tokenizer_json_beside(const std::string& init_from);

}  // namespace data
