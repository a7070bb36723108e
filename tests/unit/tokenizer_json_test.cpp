// The tokenizer.json reader (data/tokenizer_json.h) against the `tokenizers` library: three small
// byte-level BPE tokenizers trained by tests/unit/bpe_reference.py (GPT-2's pattern with "a b"
// merges; Llama 3's Split pattern with ignore_merges and [a, b] merges; Digits then ByteLevel
// with a prefix space) give tokenizers' ids on a corpus of accents, combining marks, CJK, Korean,
// Arabic, Hindi, emoji sequences, code with tabs and CRLF, whitespace runs, Unicode spaces and
// added tokens, and decode it back byte for byte. Five SentencePiece-style ones (Llama 2's
// normalizer; Metaspace first, always and never; Gemma's Replace and Splits; byte fallback,
// <unk>, neither) give its ids on that corpus, whose non-ASCII characters their vocabulary lacks,
// and its decoded text. Then the refusals and data.tokenizer's choice.
#include "data/tokenizer_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/python_runner.h"
#include "common/temp_dir.h"
#include "data/errors.h"
#include "data/tokenizer.h"

namespace TRAINER_UNITY_ID {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The reference tokenizers and ids, made once for the suite in a directory of its own.
class TokenizerJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string log = dir_->file("log.txt");
    const std::string script = std::string(TRAINER_SOURCE_DIR) + "/tests/unit/bpe_reference.py";
    if (test::run_python(script, dir_->path(), log) != 0) {
      setup_error_ = script + " " + dir_->path() + "\n" + read_all(log);
      return;
    }
    expected_ = new nlohmann::json(nlohmann::json::parse(read_all(dir_->file("expected.json"))));
  }
  static void TearDownTestSuite() {
    const std::string cmd = "rm -rf '" + dir_->path() + "'";
    [[maybe_unused]] const int rc = std::system(cmd.c_str());
    delete expected_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  static std::string path(const std::string& kind) { return dir_->file(kind + "/tokenizer.json"); }

  // Every document's ids equal tokenizers', and so do those of all of them joined; with
  // `round_trip` decode gives each document back byte for byte. A SentencePiece-style kind ("spm-")
  // encodes spm_docs and decodes each as tokenizers' decode does.
  static void expect_reference_ids(const std::string& kind, bool round_trip) {
    const auto tok = data::make_tokenizer(path(kind));
    const bool spm = kind.starts_with("spm-");
    const auto& docs = expected_->at(spm ? "spm_docs" : "docs");
    const auto& ref = expected_->at(kind);
    ASSERT_GE(docs.size(), 12u);
    std::string whole;
    for (size_t i = 0; i < docs.size(); ++i) {
      const std::string doc = docs[i].get<std::string>();
      const auto ids = tok->encode(doc);
      EXPECT_EQ(ids, ref.at("ids")[i].get<std::vector<int64_t>>())
          << kind << ", document " << i << ": " << doc;
      if (round_trip) {
        EXPECT_EQ(tok->decode(ids), doc) << kind << ", document " << i;
      }
      if (spm) {
        EXPECT_EQ(tok->decode(ids), ref.at("decoded")[i].get<std::string>())
            << kind << ", document " << i;
      }
      whole += (i ? "\n" : "") + doc;
    }
    EXPECT_EQ(tok->encode(whole), ref.at("whole").get<std::vector<int64_t>>()) << kind;
  }

  static test::TempDir* dir_;
  static nlohmann::json* expected_;
  static std::string setup_error_;
};
test::TempDir* TokenizerJson::dir_ = nullptr;
nlohmann::json* TokenizerJson::expected_ = nullptr;
std::string TokenizerJson::setup_error_;

TEST_F(TokenizerJson, Gpt2PatternEqualsTokenizersAndDecodesBack) {
  expect_reference_ids("gpt2-pattern", true);
}

TEST_F(TokenizerJson, Llama3PatternEqualsTokenizersAndDecodesBack) {
  expect_reference_ids("llama3-pattern", true);
}

// Ids above 65,535 with a vocabulary that skips ids 0..68,999.
TEST_F(TokenizerJson, AWideVocabularyWithHolesEqualsTokenizers) {
  expect_reference_ids("wide", true);
  EXPECT_EQ(data::make_tokenizer(path("wide"))->end_of_text(), 69000);
  EXPECT_EQ(data::make_tokenizer(path("wide"))->decode({5, 69000}), "<|endoftext|>");  // a hole
}

// The prefix space is part of the ids, so decode gives it back too (as tokenizers' does).
TEST_F(TokenizerJson, DigitsAndPrefixSpaceEqualTokenizers) {
  expect_reference_ids("digits-prefix", false);
}

TEST_F(TokenizerJson, AddedTokensAreSplitOutAndSpelled) {
  const auto tok = data::make_tokenizer(path("llama3-pattern"));
  EXPECT_EQ(tok->encode("<|endoftext|>"), (std::vector<int64_t>{0}));
  const auto ids = tok->encode("x<|begin_of_text|>hi");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(tok->end_of_text(), 0);
  EXPECT_EQ(tok->decode({0, 1}), "<|endoftext|><|begin_of_text|>");
  EXPECT_EQ(tok->name(), path("llama3-pattern"));
  const std::string bytes = "not \xff\xfe utf-8 \xe6\x97";
  EXPECT_EQ(tok->decode(tok->encode(bytes)), bytes);
  EXPECT_EQ(tok->decode({0, tok->vocab_size(), 1 << 20}), "<|endoftext|>");  // no spelling: skipped
  EXPECT_THROW(tok->decode({-1}), std::out_of_range);
}

// Llama 2's layout: the normalizer Prepend + Replace, no pre-tokenizer, byte fallback. Characters
// the vocabulary lacks (CJK, emoji, most accents) are their bytes' tokens, and the documents
// without Llama 2's special tokens decode back byte for byte.
TEST_F(TokenizerJson, SentencePieceLlama2NormalizerEqualsTokenizers) {
  expect_reference_ids("spm-llama2", false);
  const auto& docs = expected_->at("spm_docs");
  const auto& decoded = expected_->at("spm-llama2").at("decoded");
  for (size_t i = 0; i + 1 < docs.size(); ++i) EXPECT_EQ(decoded[i], docs[i]) << i;
}

// Metaspace (prepend_scheme first, no split) with ignore_merges and a token no merge reaches.
TEST_F(TokenizerJson, SentencePieceMetaspaceFirstEqualsTokenizers) {
  expect_reference_ids("spm-first", false);
}

// Gemma's Replace normalizer and Split(" ", MergedWithPrevious); Splits merged with the previous
// and the next piece; a decoder without Strip. The documents without a literal "▁" decode back.
TEST_F(TokenizerJson, SentencePieceGemmaSplitsEqualTokenizers) {
  expect_reference_ids("spm-gemma", false);
  const auto& docs = expected_->at("spm_docs");
  const auto& decoded = expected_->at("spm-gemma").at("decoded");
  for (size_t i = 0; i + 1 < docs.size(); ++i) EXPECT_EQ(decoded[i], docs[i]) << i;
}

// No byte fallback: <unk> for each character the vocabulary lacks (spm-always, Metaspace's
// decoder), or nothing (spm-never: no unknown token).
TEST_F(TokenizerJson, SentencePieceWithoutByteFallbackEqualsTokenizers) {
  expect_reference_ids("spm-always", false);
  expect_reference_ids("spm-never", false);
}

// Bytes that are not UTF-8 (which `tokenizers` cannot be given) are each their <0xNN> token and
// decode back as themselves, where tokenizers' ByteFallback writes U+FFFD; a continuation keeps
// the space its first token stands for, which the text's first token loses.
TEST_F(TokenizerJson, SentencePieceByteFallbackDecodesByteForByte) {
  for (const char* kind : {"spm-llama2", "spm-first"}) {
    const auto tok = data::make_tokenizer(path(kind));
    for (const std::string text :
         {"not \xff\xfe utf-8 \xe6\x97", "\xed\xa0\x80 \xc0\xaf\xf4\x90\x80\x80", "\x97x\xe6"}) {
      EXPECT_EQ(tok->decode(tok->encode(text)), text) << kind;
    }
    const auto ids = tok->encode("x\xff");
    ASSERT_GE(ids.size(), 1u);
    EXPECT_EQ(ids.back(), 3 + 0xFF) << kind;  // <0xFF>
    EXPECT_EQ(tok->decode({3 + 0xE6, 3 + 0x97}), "\xe6\x97") << kind;
    EXPECT_EQ(tok->decode({3 + 0xE6, 3 + 0x97, 3 + 0xA5}), "日") << kind;
    const auto hello = tok->encode("Hello"), world = tok->encode("world");  // "▁world"
    EXPECT_EQ(tok->decode(world), "world") << kind;
    EXPECT_EQ(data::decode_continuation(*tok, hello, world), " world") << kind;
    EXPECT_EQ(data::decode_continuation(*tok, {}, world), "world") << kind;
  }
  const auto tok = data::make_tokenizer(path("spm-llama2"));
  EXPECT_EQ(tok->encode("<s>"), (std::vector<int64_t>{1}));
  EXPECT_EQ(tok->decode({1, 2}), "<s></s>");
  EXPECT_EQ(tok->end_of_text(), std::nullopt);
  EXPECT_EQ(tok->decode({tok->vocab_size(), 1 << 20}), "");  // no spelling: skipped
  EXPECT_THROW(tok->decode({-1}), std::out_of_range);
}

// A vocabulary with some byte tokens only: a character whose bytes all have one falls back to
// them, another is <unk>, which waits for the next character with a token (or the end), even past
// a fallback, and is one for a run with fuse_unk. The ids are tokenizers 0.23.3's for this file.
TEST(TokenizerJsonSentencePiece, PartialByteFallbackOrdersUnknownsAsTokenizers) {
  test::TempDir dir;
  for (const bool fuse : {true, false}) {
    const std::string f = dir.file(fuse ? "fused.json" : "unfused.json");
    std::ofstream(f) << R"({"model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
        "fuse_unk": )"
                     << (fuse ? "true" : "false")
                     << R"(, "vocab": {"<unk>": 0, "a": 1, "▁": 2, "<0xC3>": 3, "<0xA9>": 4,
        "<0xE6>": 5}, "merges": []},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})";
    const auto tok = data::make_tokenizer(f);
    using Ids = std::vector<int64_t>;
    EXPECT_EQ(tok->encode("漢éa"), (Ids{3, 4, 0, 1})) << fuse;
    EXPECT_EQ(tok->encode("漢字éa"), fuse ? (Ids{3, 4, 0, 1}) : (Ids{0, 3, 4, 0, 1}));
    EXPECT_EQ(tok->encode("a漢字"), fuse ? (Ids{1, 0}) : (Ids{1, 0, 0}));
    EXPECT_EQ(tok->encode("漢é"), (Ids{3, 4, 0})) << fuse;
  }
}

void expect_refused(const std::string& file, const std::string& json, const std::string& needle) {
  std::ofstream(file) << json;
  try {
    data::make_tokenizer(file);
    FAIL() << "expected data::DataError for " << json;
  } catch (const data::DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(TokenizerJsonRefusal, OtherKindsNameTheirModelTypeAndTheFile) {
  test::TempDir dir;
  const std::string f = dir.file("tokenizer.json");
  expect_refused(f, R"({"model": {"type": "WordPiece", "vocab": {}}})",
                 "a WordPiece tokenizer (model.type WordPiece)");
  expect_refused(f, R"({"model": {"type": "Unigram", "vocab": []}})",
                 "a Unigram tokenizer (model.type Unigram)");
  expect_refused(f,
                 R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": null})",
                 "decoder: decoder null is not read (a BPE on characters");
  expect_refused(f, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
                 "model.merges[0] (a + b): 'b' is not in model.vocab");
  expect_refused(f, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                        "pre_tokenizer": {"type": "ByteLevel"}})",
                 "no token for the single byte 0");
  expect_refused(f, "{\"model\": ", "not JSON");
  expect_refused(dir.file("missing.json"), "", "");
  // An id past the largest read is refused before the table grows to it (the fuzz finding in
  // tests/fuzz/regressions/tokenizer_json: 1.3e18). Ids below it may skip some (holes):
  // AWideVocabularyWithHolesEqualsTokenizers.
  expect_refused(f,
                 R"({"model": {"type": "BPE", "vocab": {"a": 1320000000000000000}, "merges": []}})",
                 "model.vocab[\"a\"]: id 1320000000000000000 is past the largest the trainer reads "
                 "(4194303");
}

// What a SentencePiece-style file may hold beyond what the trainer reads is named with its key.
TEST(TokenizerJsonRefusal, SentencePieceStepsNotReadNameTheirKey) {
  test::TempDir dir;
  const std::string f = dir.file("tokenizer.json");
  const std::string model = R"("model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0},
                                         "merges": []})";
  const std::string decoder = R"("decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}]})";
  expect_refused(f, "{" + model + R"(, "normalizer": {"type": "NFKC"}, )" + decoder + "}",
                 "normalizer: normalizer NFKC is not read (Prepend, Replace, Sequence are)");
  expect_refused(f,
                 "{" + model + R"(, "normalizer": {"type": "Sequence", "normalizers": [
                   {"type": "Prepend", "prepend": "_"},
                   {"type": "Replace", "pattern": {"Regex": " +"}, "content": "_"}]}, )" +
                     decoder + "}",
                 "normalizer.normalizers[1]: Replace is read with a String pattern only");
  expect_refused(f, "{" + model + R"(, "decoder": {"type": "Sequence", "decoders": [
                   {"type": "ByteFallback"}, {"type": "ByteLevel"}]}})",
                 "decoder.decoders[1]: decoder ByteLevel is not read");
  expect_refused(f, "{" + model + "}", "decoder: decoder null is not read");
  expect_refused(f,
                 "{" + model + R"(, "pre_tokenizer": {"type": "Metaspace", "replacement": "_",
                   "prepend_scheme": "sometimes"}, )" +
                     decoder + "}",
                 "pre_tokenizer.prepend_scheme: \"sometimes\" is not always, first or never");
  expect_refused(f,
                 "{" + model + R"(, "pre_tokenizer": {"type": "Metaspace", "replacement": "__"},
                   )" +
                     decoder + "}",
                 "pre_tokenizer.replacement: \"__\" is not one character");
  expect_refused(f, "{" + model + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                   {"type": "Metaspace", "replacement": "_"}, {"type": "ByteLevel"}]}})",
                 "pre_tokenizer.pretokenizers[1]: ByteLevel after Metaspace");
  expect_refused(f,
                 R"({"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0},
                   "merges": []}, )" +
                     decoder + "}",
                 "model.unk_token: \"<unk>\" is not in model.vocab");
  expect_refused(f, "{" + model + R"(, "pre_tokenizer": {"type": "Whitespace"}, )" + decoder + "}",
                 "pre_tokenizer: pre-tokenizer Whitespace is not read");
  expect_refused(f,
                 "{" + model + R"(, "pre_tokenizer": {"type": "Metaspace", "replacement": "_",
                   "split": "yes"}, )" +
                     decoder + "}",
                 "type must be boolean");
  // Strip's counts: a float past any size_t (a fuzz finding, tests/fuzz/regressions/
  // tokenizer_json: undefined behaviour in the conversion) and a negative number, by name.
  for (const std::string start : {"3.3e98", "-1"}) {
    expect_refused(f,
                   "{" + model + R"(, "decoder": {"type": "Sequence", "decoders": [
                     {"type": "Strip", "content": " ", "start": )" +
                       start + R"(, "stop": 0}]}})",
                   "decoder.decoders[0].start: " + start.substr(0, 2));
  }
}

TEST(ChooseTokenizer, AutoTakesTheTokenizerJsonBesideInitFromElseGoesByVocabSize) {
  test::TempDir dir;
  data::DataOptions d;
  d.tokenizer = "auto";
  d.vocab_size = 256;
  EXPECT_EQ(data::choose_tokenizer(d, "")->name(), "bytes");
  EXPECT_EQ(data::choose_tokenizer(d, dir.path())->name(), "bytes");  // no tokenizer.json there
  d.vocab_size = 300;
  try {
    data::choose_tokenizer(d, "");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("data.tokenizer: auto knows no encoding"),
              std::string::npos)
        << e.what();
  }
  // A tokenizer.json beside the weights is found (and here refused: its vocabulary is empty),
  // whether init_from names the directory or a file in it.
  std::ofstream(dir.file("tokenizer.json"))
      << R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})";
  EXPECT_THROW(data::choose_tokenizer(d, dir.path()), data::DataError);
  try {
    data::choose_tokenizer(d, dir.file("model.safetensors"));
    FAIL() << "expected data::DataError";
  } catch (const data::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("data.tokenizer: " + dir.file("tokenizer.json")),
              std::string::npos)
        << e.what();
  }
  d.tokenizer = "gtp2";
  EXPECT_THROW(data::choose_tokenizer(d, ""), std::invalid_argument);
}

TEST_F(TokenizerJson, ChooseTokenizerTakesAPathAndChecksTheVocabularyFits) {
  data::DataOptions d;
  d.tokenizer = path("gpt2-pattern");
  d.vocab_size = 2000;
  const auto tok = data::choose_tokenizer(d, "");
  EXPECT_EQ(tok->name(), path("gpt2-pattern"));
  d.vocab_size = 300;
  try {
    data::choose_tokenizer(d, "");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("above data.vocab_size = 300"), std::string::npos)
        << e.what();
  }
  d.tokenizer = "auto";
  d.vocab_size = 2000;
  EXPECT_EQ(data::choose_tokenizer(d, dir_->path() + "/gpt2-pattern/model.safetensors")->name(),
            dir_->path() + "/gpt2-pattern/tokenizer.json");
}

}  // namespace TRAINER_UNITY_ID
