// A tiktoken ranks file (GPT-2's gpt2.tiktoken: "BASE64 RANK" lines) through read_gpt2_ranks, the
// reader of make_tokenizer("gpt2"), and the BpeTokenizer it builds. Typed error: data::DataError.
#include "data/bpe_tokenizer.h"
#include "data/errors.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(tiktoken_ranks) {
  const std::string path =
      fuzz::write_file("tiktoken_ranks/gpt2.tiktoken", fuzz::as_text(data, size));
  try {
    const data::BpeTokenizer tokenizer(data::read_gpt2_ranks(path));
    tokenizer.decode(tokenizer.encode("Hello world, 123 times!\n\xff"));
  } catch (const data::DataError&) {
  }
  return 0;
}
