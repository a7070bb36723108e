// The tokenizers the encode and decode targets run arbitrary bytes and ids through, each built
// once: bytes; GPT-2's ranks (gpt2, where the cache has them: scripts/bootstrap.sh --dev);
// a byte-level tokenizer.json (data/chat-sample's, Llama 3's layout); a SentencePiece-style one
// (fixtures/spm-llama2.tokenizer.json, Llama 2's, made by tests/unit/bpe_reference.py).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace fuzz {

struct FuzzTokenizer {
  std::unique_ptr<data::Tokenizer> tokenizer;
  bool round_trip = false;  // decode(encode(text)) == text for every text (data/tokenizer.h)
};

inline const std::vector<FuzzTokenizer>& fuzz_tokenizers() {
  static const std::vector<FuzzTokenizer> all = [] {
    std::vector<FuzzTokenizer> out;
    const std::string source = TRAINER_SOURCE_DIR;
    out.push_back({data::make_tokenizer("bytes"), true});
    if (std::filesystem::exists(data::gpt2_ranks_path())) {
      out.push_back({data::make_tokenizer("gpt2"), true});
    }
    out.push_back(
        {data::make_tokenizer(source + "/data/chat-sample/tokenizer/tokenizer.json"), true});
    out.push_back(
        {data::make_tokenizer(source + "/tests/fuzz/fixtures/spm-llama2.tokenizer.json"), false});
    return out;
  }();
  return all;
}

}  // namespace fuzz

#ifdef TRAINER_FUZZ_LIBFUZZER
// The tokenizers are built before the first input (gpt2's takes seconds under the sanitizers),
// so that libFuzzer's -timeout counts the input alone. (A libFuzzer binary is one target: this
// header is in one translation unit of it.)
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::fuzz_tokenizers();
  return 0;
}
#endif
