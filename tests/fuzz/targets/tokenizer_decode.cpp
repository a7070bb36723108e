// Arbitrary ids (little-endian uint16, 0xffff standing for -1) decoded by each tokenizer the
// trainer builds (fuzz/tokenizers.h; the first byte picks one), alone and as the continuation of
// a context (decode_continuation: --generate's output, a sample after its prompt). Typed error:
// std::out_of_range for an id the tokenizer says it refuses (negative; bytes: not a byte).
#include <cstring>
#include <stdexcept>

#include "data/gpt2_tokenizer.h"
#include "fuzz_target.h"
#include "tokenizers.h"

TRAINER_FUZZ_TARGET(tokenizer_decode) {
  if (size == 0) return 0;
  const auto& all = fuzz::fuzz_tokenizers();
  const data::Tokenizer& t = *all[data[0] % all.size()].tokenizer;
  std::vector<int64_t> ids((size - 1) / 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint16_t id = 0;
    std::memcpy(&id, data + 1 + 2 * i, 2);
    ids[i] = id == 0xffff ? -1 : id;
  }
  try {
    t.decode(ids);
    const size_t half = ids.size() / 2;
    data::decode_continuation(t, {ids.begin(), ids.begin() + static_cast<ptrdiff_t>(half)},
                              {ids.begin() + static_cast<ptrdiff_t>(half), ids.end()});
  } catch (const std::out_of_range&) {
  }
  return 0;
}
