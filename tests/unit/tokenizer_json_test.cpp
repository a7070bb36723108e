// The tokenizer.json reader (data/tokenizer_json.h) against the `tokenizers` library: three small
// byte-level BPE tokenizers trained by tests/unit/bpe_reference.py (GPT-2's pattern with "a b"
// merges; Llama 3's Split pattern with ignore_merges and [a, b] merges; Digits then ByteLevel
// with a prefix space) give tokenizers' ids on a corpus of accents, combining marks, CJK, Korean,
// Arabic, Hindi, emoji sequences, code with tabs and CRLF, whitespace runs, Unicode spaces and
// added tokens, and decode it back byte for byte. Then the refusals and data.tokenizer's choice.
#include "data/tokenizer_json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

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
    const std::string cmd = std::string(TRAINER_PYTHON) + " " + TRAINER_SOURCE_DIR +
                            "/tests/unit/bpe_reference.py " + dir_->path() + " > " + log + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      setup_error_ = cmd + "\n" + read_all(log);
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
  // `round_trip` decode gives each document back byte for byte.
  static void expect_reference_ids(const std::string& kind, bool round_trip) {
    const auto tok = data::make_tokenizer(path(kind));
    const auto& docs = expected_->at("docs");
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
                 R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}})",
                 "SentencePiece-style BPE tokenizer (model.byte_fallback: true)");
  expect_refused(f, R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                        "pre_tokenizer": {"type": "Metaspace", "replacement": "_"}})",
                 "SentencePiece-style tokenizer (pre-tokenizer Metaspace)");
  expect_refused(f,
                 R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": null})",
                 "no ByteLevel pre-tokenizer");
  expect_refused(f, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
                 "model.merges[0] (a + b): 'b' is not in model.vocab");
  expect_refused(f, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                        "pre_tokenizer": {"type": "ByteLevel"}})",
                 "no token for the single byte 0");
  expect_refused(f, "{\"model\": ", "not JSON");
  expect_refused(dir.file("missing.json"), "", "");
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
