#include "data/tokenizer_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "data/errors.h"
#include "data/gpt2_tokenizer.h"
#include "data/mapped_file.h"

namespace data {
namespace {

using Json = nlohmann::json;

// `tokenizers`' ByteLevel pre-tokenizer pattern (GPT-2's original), used where use_regex is true.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 onwards, in byte order. byte_of[cp] inverts it (-1: a code point no byte maps to).
// spelled[b] is byte b's character, in UTF-8.
struct ByteLevelAlphabet {
  std::array<int, 256 + 68> byte_of{};
  std::array<std::string, 256> spelled;
  ByteLevelAlphabet() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      byte_of[static_cast<size_t>(cp)] = b;
      std::string& s = spelled[static_cast<size_t>(b)];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

// The bytes a byte-level vocabulary string stands for; nullopt when a character of it is outside
// the alphabet (the token is then spelled as its own UTF-8, as `tokenizers`' decoder does).
std::optional<std::string> byte_level_bytes(const std::string& s) {
  static const ByteLevelAlphabet alphabet;
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t n = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < s.size()) {
      cp = (c & 0x1Fu) << 6 | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      n = 2;
    } else if (c >= 0x80) {
      return std::nullopt;  // three-byte characters and beyond are far above U+0143
    }
    if (cp >= alphabet.byte_of.size() || alphabet.byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(alphabet.byte_of[cp]));
    i += n;
  }
  return out;
}

// A pattern for a literal string: ASCII punctuation escaped (PCRE2 reads "\<non-alnum>" as it).
std::string literal_pattern(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) {
      out += '\\';
    }
    out += c;
  }
  return out;
}

// What the pre-tokenizer says about the file: a ByteLevel step makes it byte-level, a Metaspace
// one SentencePiece-style; neither: a BPE on characters (Llama 2's, with a normalizer instead).
struct PreTokenizerKind {
  bool byte_level = false;
  bool metaspace = false;
};

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  BpeSpec read();

 private:
  DataError error(const std::string& what) const {
    return DataError(fmt::format("{}: {}", path_, what));
  }
  Json load() const;
  void check_model(const Json& model) const;
  void read_vocab(const Json& vocab, BpeSpec& spec);
  void read_merges(const Json& merges, BpeSpec& spec) const;
  void read_pre_tokenizer(const Json& p, BpeSpec& spec, PreTokenizerKind& kind,
                          const std::string& where) const;
  BpeSpec::Split read_metaspace(const Json& p, const std::string& where) const;
  void read_normalizer(const Json& n, BpeSpec& spec, const std::string& where) const;
  void read_decoder(const Json& d, BpeSpec& spec, const std::string& where) const;
  void read_characters(const Json& j, BpeSpec& spec) const;
  std::string one_character(const Json& p, const char* key, const std::string& where) const;
  void read_added(const Json& added, BpeSpec& spec) const;

  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;  // the vocabulary's string -> id
};

Json Reader::load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw error("cannot read the tokenizer file");
  try {
    return Json::parse(in);
  } catch (const Json::exception& e) {
    throw error(fmt::format("not JSON ({})", e.what()));
  }
}

std::string type_of(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("(no type)");
}

bool set_and_not(const Json& j, const char* key, const Json& off) {
  return j.contains(key) && !j[key].is_null() && j[key] != off;
}

void Reader::check_model(const Json& model) const {
  const std::string type = type_of(model);
  if (type != "BPE") {
    throw error(fmt::format("a {} tokenizer (model.type {}): the trainer reads BPE tokenizer.json "
                            "files only (byte-level: GPT-2, Llama 3, SmolLM, Qwen2; "
                            "SentencePiece-style: Llama 2, Mistral)",
                            type, type));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (set_and_not(model, key, "")) {
      throw error(fmt::format("model.{} is set: subword prefixes and suffixes are not read", key));
    }
  }
  if (set_and_not(model, "dropout", 0.0)) {
    throw error(
        "model.dropout is set: BPE dropout makes encoding random; remove it for training data");
  }
}

constexpr int64_t kMaxTokenId = int64_t{1} << 22;  // 4,194,304 ids: 16 x the largest vocabulary

void Reader::read_vocab(const Json& vocab, BpeSpec& spec) {
  if (!vocab.is_object()) throw error("model.vocab is not an object of token -> id");
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0) {
      throw error(fmt::format("model.vocab[\"{}\"]: the id is not a non-negative integer", token));
    }
    const int64_t id = id_json.get<int64_t>();
    // The table is indexed by id (holes are allowed: a vocabulary may skip ids), so an id is
    // bounded before the table grows to it: a fuzz finding's id of 1.3e18 asked for as many
    // entries. The largest vocabularies are about 2^18 (Gemma 3's 262,144).
    if (id >= kMaxTokenId) {
      throw error(fmt::format("model.vocab[\"{}\"]: id {} is past the largest the trainer reads "
                              "({}: no tokenizer has that many tokens)",
                              token, id, kMaxTokenId - 1));
    }
    vocab_[token] = id;
    if (static_cast<size_t>(id) >= spec.tokens.size())
      spec.tokens.resize(static_cast<size_t>(id) + 1);
    if (spec.symbols == BpeSpec::Symbols::kCharacters) {
      spec.tokens[static_cast<size_t>(id)] = token;
    } else if (auto bytes = byte_level_bytes(token)) {
      spec.tokens[static_cast<size_t>(id)] = std::move(*bytes);
    } else {
      spec.unsplit.push_back({token, id});  // never made by merges; decodes as its text
    }
  }
}

void Reader::read_merges(const Json& merges, BpeSpec& spec) const {
  if (!merges.is_array()) throw error("model.merges is not a list");
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        throw error(
            fmt::format("model.merges[{}]: \"{}\" is not two tokens separated by a space", i, s));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw error(fmt::format("model.merges[{}]: neither \"a b\" nor [\"a\", \"b\"]", i));
    }
    auto id = [&](const std::string& token) {
      const auto it = vocab_.find(token);
      if (it == vocab_.end()) {
        throw error(fmt::format("model.merges[{}] ({} + {}): '{}' is not in model.vocab", i, left,
                                right, token));
      }
      return it->second;
    };
    spec.merges.push_back({id(left), id(right), id(left + right), static_cast<uint32_t>(i)});
  }
}

void Reader::read_pre_tokenizer(const Json& p, BpeSpec& spec, PreTokenizerKind& kind,
                                const std::string& where) const {
  const std::string type = type_of(p);
  if (kind.byte_level) {
    throw error(fmt::format("{}: {} after ByteLevel (ByteLevel must come last)", where, type));
  }
  if (type == "Sequence") {
    const Json& list = p.value("pretokenizers", Json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      read_pre_tokenizer(list[i], spec, kind, fmt::format("{}.pretokenizers[{}]", where, i));
    }
  } else if (type == "ByteLevel") {
    if (kind.metaspace) throw error(fmt::format("{}: ByteLevel after Metaspace", where));
    kind.byte_level = true;
    BpeSpec::Split s;
    s.multiline = true;
    if (p.value("add_prefix_space", false)) s.prefix = " ";
    if (p.value("use_regex", true)) s.pattern = kByteLevelPattern;
    if (!s.prefix.empty() || !s.pattern.empty()) spec.splits.push_back(s);
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", "");
    using Match = BpeSpec::Split::Match;
    const std::map<std::string, Match> matches = {{"Isolated", Match::kIsolated},
                                                  {"MergedWithPrevious", Match::kWithPrevious},
                                                  {"MergedWithNext", Match::kWithNext}};
    if (!matches.contains(behavior) || p.value("invert", false)) {
      throw error(fmt::format("{}: Split with behavior {}{}: only Isolated, MergedWithPrevious and "
                              "MergedWithNext, not inverted, are read",
                              where, behavior, p.value("invert", false) ? ", invert" : ""));
    }
    const Json& pattern = p.value("pattern", Json::object());
    BpeSpec::Split s;
    s.multiline = true;
    s.match = matches.at(behavior);
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      s.pattern = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      s.pattern = literal_pattern(pattern["String"].get<std::string>());
    } else {
      throw error(fmt::format("{}: Split without a Regex or String pattern", where));
    }
    spec.splits.push_back(s);
  } else if (type == "Digits") {
    BpeSpec::Split s;
    s.pattern = p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    s.multiline = true;
    spec.splits.push_back(std::move(s));
  } else if (type == "Metaspace") {
    kind.metaspace = true;
    spec.splits.push_back(read_metaspace(p, where));
  } else {
    throw error(fmt::format("{}: pre-tokenizer {} is not read (ByteLevel, Metaspace, Split, "
                            "Digits, Sequence are)",
                            where, type));
  }
}

// The one character of `key` (Metaspace's replacement, Strip's content).
std::string Reader::one_character(const Json& p, const char* key, const std::string& where) const {
  const Json& value = p.value(key, Json());
  const std::string c = value.is_string() ? value.get<std::string>() : std::string();
  const auto lead = c.empty() ? 0 : static_cast<unsigned char>(c[0]);
  const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  if (c.size() != n) {
    throw error(fmt::format("{}.{}: {} is not one character", where, key, value.dump()));
  }
  return c;
}

// Metaspace: ' ' becomes the replacement, the replacement goes in front (prepend_scheme; older
// files' add_prefix_space: true is "always"), and with split the piece is cut before each
// replacement (`tokenizers`' Split behaviour MergedWithNext).
BpeSpec::Split Reader::read_metaspace(const Json& p, const std::string& where) const {
  BpeSpec::Split s;
  s.space_as = one_character(p, "replacement", where);
  std::string scheme = "always";
  if (p.contains("prepend_scheme")) {
    scheme = p["prepend_scheme"].is_string() ? p["prepend_scheme"].get<std::string>() : "";
  } else if (!p.value("add_prefix_space", true)) {
    scheme = "never";
  }
  if (scheme != "always" && scheme != "first" && scheme != "never") {
    throw error(fmt::format("{}.prepend_scheme: {} is not always, first or never", where,
                            p["prepend_scheme"].dump()));
  }
  if (scheme != "never") s.prefix = s.space_as;
  s.prefix_first_only = scheme == "first";
  if (p.value("split", true)) {
    s.pattern = literal_pattern(s.space_as);
    s.match = BpeSpec::Split::Match::kWithNext;
  }
  return s;
}

void Reader::read_normalizer(const Json& n, BpeSpec& spec, const std::string& where) const {
  const std::string type = type_of(n);
  if (type == "Sequence") {
    const Json& list = n.value("normalizers", Json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      read_normalizer(list[i], spec, fmt::format("{}.normalizers[{}]", where, i));
    }
  } else if (type == "Prepend" && n.value("prepend", Json()).is_string()) {
    spec.normalizer.push_back({"", n["prepend"].get<std::string>()});
  } else if (type == "Replace") {
    const Json& pattern = n.value("pattern", Json::object());
    if (!pattern.contains("String") || !pattern["String"].is_string() ||
        pattern["String"].get<std::string>().empty() || !n.value("content", Json()).is_string()) {
      throw error(fmt::format("{}: Replace is read with a String pattern only (\"pattern\": "
                              "{})",
                              where, pattern.dump()));
    }
    spec.normalizer.push_back(
        {pattern["String"].get<std::string>(), n["content"].get<std::string>()});
  } else {
    throw error(
        fmt::format("{}: normalizer {} is not read (Prepend, Replace, Sequence are)", where, type));
  }
}

void Reader::read_decoder(const Json& d, BpeSpec& spec, const std::string& where) const {
  using Kind = DecodeStep::Kind;
  const std::string type = d.is_null() ? "null" : type_of(d);
  DecodeStep step;
  if (type == "Sequence") {
    const Json& list = d.value("decoders", Json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      read_decoder(list[i], spec, fmt::format("{}.decoders[{}]", where, i));
    }
    return;
  } else if (type == "Replace") {
    const Json& pattern = d.value("pattern", Json::object());
    if (!pattern.contains("String") || !pattern["String"].is_string() ||
        !d.value("content", Json()).is_string()) {
      throw error(fmt::format("{}: Replace is read with a String pattern only", where));
    }
    step = {Kind::kReplace, pattern["String"].get<std::string>(), d["content"].get<std::string>()};
  } else if (type == "ByteFallback" || type == "Fuse") {
    step.kind = type == "Fuse" ? Kind::kFuse : Kind::kByteFallback;
  } else if (type == "Strip") {
    // Absent is 0; a number that is not a non-negative integer is refused by name (a fuzz
    // finding: 3.3e98, whose conversion to size_t is undefined behaviour).
    const auto count = [&](const char* key) {
      const Json v = d.value(key, Json(0u));
      if (!v.is_number_unsigned()) {
        throw error(fmt::format("{}.{}: {} is not a non-negative integer", where, key, v.dump()));
      }
      return v.get<size_t>();
    };
    step = {Kind::kStrip, one_character(d, "content", where), "", count("start"), count("stop")};
  } else if (type == "Metaspace") {
    const BpeSpec::Split s = read_metaspace(d, where);
    step = {Kind::kMetaspace, s.space_as, "", s.prefix.empty() ? size_t{0} : size_t{1}};
  } else {
    throw error(fmt::format("{}: decoder {} is not read (a BPE on characters, SentencePiece-style, "
                            "is decoded by Replace, ByteFallback, Fuse, Strip, Metaspace and "
                            "Sequences of them)",
                            where, type));
  }
  spec.decoder.push_back(std::move(step));
}

// A BPE on characters (SentencePiece-style): its normalizer, unknown token, byte fallback and
// decoder.
void Reader::read_characters(const Json& j, BpeSpec& spec) const {
  const Json& model = j["model"];
  const Json& normalizer = j.value("normalizer", Json());
  if (!normalizer.is_null()) read_normalizer(normalizer, spec, "normalizer");
  spec.byte_fallback = model.value("byte_fallback", false);
  spec.fuse_unknown = model.value("fuse_unk", false);
  const Json& unk = model.value("unk_token", Json());
  if (unk.is_string()) {
    const auto it = vocab_.find(unk.get<std::string>());
    if (it == vocab_.end()) {
      throw error(fmt::format("model.unk_token: {} is not in model.vocab", unk.dump()));
    }
    spec.unknown = it->second;
  } else if (!unk.is_null()) {
    throw error(fmt::format("model.unk_token: {} is not a string", unk.dump()));
  }
  read_decoder(j.value("decoder", Json()), spec, "decoder");
}

// The ids are the ones `tokenizers` (0.23) gives when it loads the file, not the "id" fields: a
// token whose content is a vocabulary entry takes that entry's id; the others take the ids after
// the vocabulary's entry count, in the file's order. For GPT-2, Llama 3 and trained tokenizers
// that is the file's id.
void Reader::read_added(const Json& added, BpeSpec& spec) const {
  std::unordered_map<std::string, int64_t> given;
  auto next = static_cast<int64_t>(vocab_.size());
  for (const Json& t : added) {
    const std::string content = t.value("content", "");
    for (const char* key : {"lstrip", "rstrip", "single_word"}) {
      if (t.value(key, false)) {
        throw error(fmt::format("added token '{}' has {}: true, which the trainer does not read",
                                content, key));
      }
    }
    int64_t id = 0;
    if (const auto it = given.find(content); it != given.end()) {
      id = it->second;
    } else if (const auto v = vocab_.find(content); v != vocab_.end()) {
      id = v->second;
    } else {
      id = next++;
    }
    given.emplace(content, id);
    // A normalized token is matched, and spelled, as the normalizer writes it ("▁<x>" after
    // Llama 2's Prepend), as `tokenizers` does.
    if (t.value("normalized", false)) {
      spec.added_normalized.push_back({normalize(content, spec.normalizer), id});
    } else {
      spec.added.push_back({content, id});
    }
  }
  for (const char* eot : {"<|endoftext|>", "<|end_of_text|>"}) {
    for (const auto* pass : {&spec.added, &spec.added_normalized}) {
      for (const auto& t : *pass) {
        if (!spec.end_of_text && t.content == eot) spec.end_of_text = t.id;
      }
    }
  }
}

BpeSpec Reader::read() {
  const Json j = load();
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    throw error("no \"model\" object: not a Hugging Face tokenizer.json");
  }
  const Json& model = j["model"];
  check_model(model);
  BpeSpec spec;
  spec.name = path_;
  spec.source = path_;
  // The pre-tokenizer first: it says how the vocabulary spells its tokens.
  PreTokenizerKind kind;
  const Json& pre = j.value("pre_tokenizer", Json());
  if (!pre.is_null()) read_pre_tokenizer(pre, spec, kind, "pre_tokenizer");
  spec.symbols = kind.byte_level ? BpeSpec::Symbols::kBytes : BpeSpec::Symbols::kCharacters;
  read_vocab(model.value("vocab", Json()), spec);
  read_merges(model.value("merges", Json::array()), spec);
  spec.whole_piece_first = model.value("ignore_merges", false);
  if (kind.byte_level) {
    const Json& normalizer = j.value("normalizer", Json());
    if (!normalizer.is_null() && !(type_of(normalizer) == "Sequence" &&
                                   normalizer.value("normalizers", Json::array()).empty())) {
      throw error(fmt::format("normalizer {} is not read with a ByteLevel pre-tokenizer (the "
                              "byte-level BPE tokenizers the trainer reads have none)",
                              type_of(normalizer)));
    }
  } else {
    read_characters(j, spec);
  }
  read_added(j.value("added_tokens", Json::array()), spec);
  return spec;
}

}  // namespace

BpeSpec read_tokenizer_json(const std::string& path) {
  try {
    return Reader(path).read();
  } catch (const nlohmann::json::exception& e) {  // a key of another JSON type than it should be
    throw DataError(fmt::format("{}: {}", path, e.what()));
  }
}

bool is_tokenizer_json_path(const std::string& setting) {
  return setting.find('/') != std::string::npos ||
         (setting.size() >= 5 && setting.compare(setting.size() - 5, 5, ".json") == 0);
}

namespace {

// A token's bytes as a byte-level vocabulary spells them.
std::string byte_level_spelling(const std::string& bytes) {
  static const ByteLevelAlphabet alphabet;
  std::string out;
  for (const char c : bytes) out += alphabet.spelled[static_cast<unsigned char>(c)];
  return out;
}

// A byte-level BPE tokenizer.json of `spec`'s tokens and merges (merges in rank order), cut by
// the ByteLevel pre-tokenizer (GPT-2's pattern where `pattern`), with `added` tokens.
Json byte_level_json(const BpeSpec& spec, bool pattern,
                     const std::vector<BpeSpec::AddedToken>& added) {
  Json vocab = Json::object();
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (spec.tokens[id]) vocab[byte_level_spelling(*spec.tokens[id])] = id;
  }
  std::vector<BpeSpec::Merge> merges = spec.merges;
  std::stable_sort(merges.begin(), merges.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  Json pairs = Json::array();
  for (const auto& m : merges) {
    pairs.push_back(byte_level_spelling(*spec.tokens.at(static_cast<size_t>(m.left))) + " " +
                    byte_level_spelling(*spec.tokens.at(static_cast<size_t>(m.right))));
  }
  Json special = Json::array();
  for (const auto& a : added) {
    vocab[a.content] = a.id;
    special.push_back({{"id", a.id},
                       {"content", a.content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", pattern}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", special},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", spec.whole_piece_first},
            {"vocab", vocab},
            {"merges", pairs}}}};
}

}  // namespace

std::string builtin_tokenizer_json(const std::string& encoding) {
  if (encoding == "bytes") {
    BpeSpec bytes;
    for (int b = 0; b < 256; ++b) bytes.tokens.emplace_back(std::string(1, static_cast<char>(b)));
    return byte_level_json(bytes, false, {}).dump() + "\n";
  }
  if (encoding == "gpt2") {
    const BpeSpec gpt2 = read_gpt2_ranks(gpt2_ranks_path());
    return byte_level_json(gpt2, true, gpt2.unsplit).dump() + "\n";
  }
  throw std::invalid_argument(fmt::format("no built-in tokenizer '{}' (bytes, gpt2)", encoding));
}

std::string tokenizer_json_beside(const std::string& init_from) {
  if (init_from.empty()) return "";
  const std::string candidate = folder_of(init_from) + "/tokenizer.json";
  return is_regular_file(candidate) ? candidate : "";
}

}  // namespace data
