// Arbitrary bytes (text that need not be UTF-8) encoded by each tokenizer the trainer builds
// (fuzz/tokenizers.h; the first byte picks one) and decoded back: --generate's prompt, a chat
// prompt. Every id is in the vocabulary, and where the tokenizer promises it (bytes, gpt2, a
// byte-level tokenizer.json without a prefix space) decode gives the text back byte for byte.
// Nothing may throw.
#include <cstdlib>

#include "data/gpt2_tokenizer.h"
#include "fuzz_target.h"
#include "tokenizers.h"

TRAINER_FUZZ_TARGET(tokenizer_encode) {
  if (size == 0) return 0;
  const auto& all = fuzz::fuzz_tokenizers();
  const fuzz::FuzzTokenizer& t = all[data[0] % all.size()];
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  const std::vector<int64_t> ids = t.tokenizer->encode(text);
  for (const int64_t id : ids) {
    if (id < 0 || id >= t.tokenizer->vocab_size()) std::abort();
  }
  const std::string back = t.tokenizer->decode(ids);
  if (t.round_trip && back != text) std::abort();
  return 0;
}
