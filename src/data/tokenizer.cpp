#include "data/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "data/errors.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer_json.h"

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

std::string decode_continuation(const Tokenizer& tokenizer, const std::vector<int64_t>& context,
                                const std::vector<int64_t>& ids) {
  if (context.empty()) return tokenizer.decode(ids);
  std::vector<int64_t> all = context;
  all.insert(all.end(), ids.begin(), ids.end());
  const std::string before = tokenizer.decode(context);
  std::string text = tokenizer.decode(all);
  if (!text.starts_with(before)) return tokenizer.decode(ids);
  return text.substr(before.size());
}

std::vector<std::string> tokenizer_names() { return {"bytes", "gpt2"}; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& encoding) {
  if (encoding == "bytes") return std::make_unique<ByteTokenizer>();
  if (encoding == "gpt2") return std::make_unique<BpeTokenizer>(read_gpt2_ranks(gpt2_ranks_path()));
  if (is_tokenizer_json_path(encoding)) {
    return std::make_unique<BpeTokenizer>(read_tokenizer_json(encoding));
  }
  throw std::invalid_argument(
      fmt::format("unknown tokenizer encoding '{}' (known: {}, or the path of a tokenizer.json)",
                  encoding, fmt::join(tokenizer_names(), ", ")));
}

std::string tokenizer_setting(const DataOptions& d, const std::string& init_from) {
  if (d.tokenizer != "auto" && !d.tokenizer.empty()) return d.tokenizer;
  if (const std::string beside = tokenizer_json_beside(init_from); !beside.empty()) return beside;
  if (d.vocab_size <= 256) return "bytes";
  if (d.vocab_size == kGpt2EndOfText + 1) return "gpt2";
  throw std::invalid_argument(fmt::format(
      "data.tokenizer: auto knows no encoding with data.vocab_size = {} (bytes: up to 256, "
      "gpt2: 50257, or a tokenizer.json beside model.init_from's weights); set data.tokenizer",
      d.vocab_size));
}

std::unique_ptr<Tokenizer> choose_tokenizer(const DataOptions& d, const std::string& init_from) {
  const std::string name = tokenizer_setting(d, init_from);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = make_tokenizer(name);
  } catch (const DataError& e) {
    throw DataError(fmt::format("data.tokenizer: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("data.tokenizer: {}", e.what()));
  }
  if (tokenizer->vocab_size() > d.vocab_size) {
    throw std::invalid_argument(
        fmt::format("data.tokenizer: {} ids go up to {}, above data.vocab_size = {}", name,
                    tokenizer->vocab_size() - 1, d.vocab_size));
  }
  return tokenizer;
}

}  // namespace data
