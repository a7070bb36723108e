#include "data/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "data/gpt2_tokenizer.h"

namespace data {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range(fmt::format("bytes tokenizer: id {} is not a byte (0..255)", id));
    }
    text.push_back(static_cast<char>(id));
  }
  return text;
}

std::vector<std::string> tokenizer_names() { return {"bytes", "gpt2"}; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& encoding) {
  if (encoding == "bytes") return std::make_unique<ByteTokenizer>();
  if (encoding == "gpt2") return std::make_unique<Gpt2Tokenizer>(gpt2_ranks_path());
  throw std::invalid_argument(fmt::format("unknown tokenizer encoding '{}' (known: {})", encoding,
                                          fmt::join(tokenizer_names(), ", ")));
}

}  // namespace data
