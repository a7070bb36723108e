// A Hugging Face tokenizer.json through make_tokenizer (data.tokenizer, and the tokenizer.json
// beside model.init_from): read_tokenizer_json and the BpeTokenizer it builds, which then encodes
// and decodes a few texts (added tokens, bytes that are not UTF-8) and decodes the first 4096 ids.
// Typed error: data::DataError.
#include "data/errors.h"
#include "data/tokenizer.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(tokenizer_json) {
  const std::string path =
      fuzz::write_file("tokenizer_json/tokenizer.json", fuzz::as_text(data, size));
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::make_tokenizer(path);
  } catch (const data::DataError&) {
    return 0;
  }
  for (const char* text : {"Hello world, 123 times!\n\tit's  <|endoftext|>x", "\xff\xe6\x97 \xc3",
                           " \xe2\x96\x81\xe4\xbd\xa0\xe5\xa5\xbd <s></s><unk>"}) {
    const std::vector<int64_t> ids = tokenizer->encode(text);
    for (const int64_t id : ids) {
      if (id < 0 || id >= tokenizer->vocab_size()) abort();  // an id outside the vocabulary
    }
    tokenizer->decode(ids);
  }
  std::vector<int64_t> all(
      static_cast<size_t>(std::min<int64_t>(tokenizer->vocab_size() + 2, 4096)));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  tokenizer->decode(all);
  return 0;
}
