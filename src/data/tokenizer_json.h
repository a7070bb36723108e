// Reads a Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Llama 3, SmolLM, Qwen2
// without its normalizer) into the BPE mechanism (data/bpe_tokenizer.h), so that encode() gives
// the ids `tokenizers`' Tokenizer.encode(text, add_special_tokens=False) gives.
//
// What is read:
//   model          type BPE: vocab (byte-level strings, mapped back to bytes by GPT-2's
//                  byte-to-unicode table), merges ("a b" strings or [a, b] pairs; the index is
//                  the rank), ignore_merges (a piece that is a token is that token).
//   pre_tokenizer  ByteLevel (add_prefix_space; use_regex: GPT-2's pattern), Split (a Regex or
//                  String pattern, behaviour Isolated), Digits, and Sequences of them, ByteLevel
//                  last. Patterns compile with PCRE2, '^' and '$' at line ends as in Oniguruma.
//   added_tokens   split out before pre-tokenization: the non-normalized ones first, then the
//                  normalized ones; each decodes to its content. end_of_text() is the added
//                  token <|endoftext|>, else <|end_of_text|>, else none.
// Not applied: the post-processor (a BOS id Llama 3's template adds) and padding/truncation.
//
// Refused with a DataError naming the file: another model type (WordPiece, Unigram, WordLevel), a
// SentencePiece-style BPE (byte_fallback, a Metaspace pre-tokenizer), a pre-tokenizer or Split
// behaviour not listed above, a normalizer, subword prefixes or suffixes, dropout, added tokens
// with lstrip, rstrip or single_word, a merge of tokens the vocabulary lacks, and a vocabulary
// without every single byte.
#pragma once

#include <string>

#include "data/bpe_tokenizer.h"

namespace data {

BpeSpec read_tokenizer_json(const std::string& path);

// Whether `setting` (data.tokenizer) names a tokenizer.json file rather than an encoding.
bool is_tokenizer_json_path(const std::string& setting);

// The tokenizer.json beside model.init_from's weights (in the directory it names, or beside the
// file it names); "" when there is none.
std::string tokenizer_json_beside(const std::string& init_from);

}  // namespace data
