// Tokenizer: text <-> token ids for language models. The C++ twin of scripts/tokenize_text.py:
// the ids it gives for a text are the ids the script writes into token shards, so a model trained
// on those shards can be prompted (--generate) and sampled (train.sample_every) in its own ids.
//
// Encodings (make_tokenizer):
//   bytes  each byte of the UTF-8 text is one id (0..255); vocabulary 256; no end-of-text id.
//   gpt2   GPT-2's BPE as tiktoken's "gpt2" encoding (data/gpt2_tokenizer.h); vocabulary 50257,
//          end of text 50256; the ranks file is gpt2_ranks_path().
//   PATH   a BPE tokenizer.json (data/tokenizer_json.h), byte-level (GPT-2, Llama 3) or
//          SentencePiece-style (Llama 2, Mistral): the ids of the `tokenizers` library; its added
//          and special tokens are split out of the text.
// gpt2 and tokenizer.json files share one BPE mechanism (data/bpe_tokenizer.h).
//
// Contract: decode(encode(t)) == t byte for byte for every text t, but where `tokenizers` itself
// does not give t back: a tokenizer.json whose ByteLevel adds a prefix space (that space stays),
// or one with a normalizer or Metaspace around added tokens ("a<s>b" is "a<s> b" under Llama 2's
// Prepend), or without byte fallback for a character its vocabulary lacks (the unknown token).
// decode() of an arbitrary id sequence returns the bytes those ids stand for, which need not be
// valid UTF-8 (a multi-byte character may be split across ids; `tokenizers` writes U+FFFD
// there). Immutable after construction: safe to share across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The encoding's name, as make_tokenizer takes it.
  virtual std::string name() const = 0;
  // Ids are below vocab_size().
  virtual int64_t vocab_size() const = 0;
  // The id that separates documents, where the encoding has one.
  virtual std::optional<int64_t> end_of_text() const = 0;
  // bytes and gpt2: ordinary text (special-token strings such as "<|endoftext|>" are encoded as
  // text); a tokenizer.json: its added tokens are split out first, as `tokenizers` does.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // bytes: throws std::out_of_range naming an id that is not a byte. The BPE encodings (gpt2, a
  // tokenizer.json) skip an id they have no spelling for, as `tokenizers` does (a model's
  // vocabulary may be wider than its tokenizer's), and throw std::out_of_range for a negative one.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return 256; }
  std::optional<int64_t> end_of_text() const override { return std::nullopt; }
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
};

// The text `ids` add after `context`: decode(context + ids) less the text of decode(context),
// which it begins with (else, decode(ids)). It differs from decode(ids) where the decoder treats
// the text's first token apart: a SentencePiece-style tokenizer.json strips the text's leading
// space, so "▁world" alone is "world" and after "▁Hello" is " world". What --generate prints
// after the prompt, and a sample after its prompt.
std::string decode_continuation(const Tokenizer& tokenizer, const std::vector<int64_t>& context,
                                const std::vector<int64_t>& ids);

// The encoding names make_tokenizer knows (besides a tokenizer.json path).
std::vector<std::string> tokenizer_names();

// `encoding`: a name of tokenizer_names() or a path to a tokenizer.json (one with a '/' or
// ending in ".json"). Throws std::invalid_argument naming `encoding` and the known names for an
// unknown one, and data::DataError naming the file for a vocabulary file that cannot be read
// (gpt2: a missing or malformed ranks file; a tokenizer.json that is missing, malformed or of
// another kind).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& encoding);

// The setting choose_tokenizer makes a tokenizer of: data.tokenizer, auto resolved as it says
// (a tokenizer.json path, bytes or gpt2). Throws std::invalid_argument naming data.tokenizer
// when auto cannot choose. --export-hf writes the tokenizer it names beside the weights
// (launcher/serving_files.h).
std::string tokenizer_setting(const DataOptions& options, const std::string& init_from);

// The tokenizer of a language-model run (--generate, train.sample_every): data.tokenizer, where
// auto is the tokenizer.json beside model.init_from's weights (`init_from`; data/tokenizer_json.h)
// when there is one, else bytes when data.vocab_size <= 256, gpt2 when it is 50257. Throws
// std::invalid_argument (a DataError for a file) naming data.tokenizer when auto cannot choose,
// the setting is unknown, or the tokenizer's ids do not fit data.vocab_size.
std::unique_ptr<Tokenizer> choose_tokenizer(const DataOptions& options,
                                            const std::string& init_from);

}  // namespace data
