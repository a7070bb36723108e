// The C++ GPT-2 tokenizer (the byte-level BPE mechanism on tiktoken's ranks) against tiktoken
// (tests/unit/gpt2_reference.py, run here through TRAINER_PYTHON) on a corpus of Unicode, code and
// whitespace runs; decoding back byte for byte; and the errors for a missing or malformed ranks
// file. The ranks are the ones scripts/bootstrap.sh fetched (data::gpt2_ranks_path()).
#include "data/gpt2_tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/python_runner.h"
#include "common/temp_dir.h"
#include "data/errors.h"

namespace TRAINER_UNITY_ID {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One tokenizer for the whole suite: loading the ranks takes a moment.
const data::BpeTokenizer& gpt2() {
  static const data::BpeTokenizer tokenizer(data::read_gpt2_ranks(data::gpt2_ranks_path()));
  return tokenizer;
}

std::vector<int64_t> as_ids(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

TEST(Gpt2Tokenizer, KnownIds) {
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int64_t>{15496, 995}));
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().end_of_text(), 50256);
  EXPECT_EQ(gpt2().name(), "gpt2");
  EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Gpt2Tokenizer, EqualsTiktokenOnAMixedCorpusAndDecodesItBack) {
  test::TempDir dir;
  const std::string out = dir.file("reference.json"), log = dir.file("log.txt");
  const std::string cmd = std::string(TRAINER_SOURCE_DIR) + "/tests/unit/gpt2_reference.py";
  const std::string args = out + " " + data::gpt2_ranks_path();
  ASSERT_EQ(test::run_python(cmd, args, log), 0) << cmd << " " << args << "\n" << read_all(log);
  const auto reference = nlohmann::json::parse(read_all(out));
  const auto& docs = reference.at("docs");
  ASSERT_GE(docs.size(), 8u);
  std::string whole;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string doc = docs[i].get<std::string>();
    const auto ids = gpt2().encode(doc);
    EXPECT_EQ(ids, as_ids(reference.at("ids")[i])) << "document " << i << ": " << doc;
    EXPECT_EQ(gpt2().decode(ids), doc) << "document " << i;
    whole += (i ? "\n" : "") + doc;
  }
  const auto ids = gpt2().encode(whole);
  EXPECT_EQ(ids, as_ids(reference.at("whole")));
  EXPECT_EQ(gpt2().decode(ids), whole);
}

TEST(Gpt2Tokenizer, EndOfTextIsAnIdThatEncodeNeverMakes) {
  EXPECT_EQ(gpt2().decode({15496, 50256, 995}), "Hello<|endoftext|> world");
  for (const int64_t id : gpt2().encode("<|endoftext|>")) EXPECT_NE(id, 50256);
  EXPECT_EQ(gpt2().decode({15496, 50257, 60000, 995}), "Hello world");  // no spelling: skipped
  EXPECT_THROW(gpt2().decode({-1}), std::out_of_range);
}

TEST(Gpt2Tokenizer, BytesThatAreNotUtf8RoundTrip) {
  const std::string text = "ok \xff\xfe caf\xc3 \xe6\x97 end\x80";
  const auto ids = gpt2().encode(text);
  EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Gpt2Tokenizer, LongRunsEncode) {
  // A megabyte of spaces before a word: the lookahead's backtracking must not exhaust PCRE2's
  // JIT stack.
  const std::string text = std::string(1 << 20, ' ') + "word " + std::string(100000, 'a');
  const auto ids = gpt2().encode(text);
  EXPECT_EQ(gpt2().decode(ids), text);
}

void expect_data_error(const std::string& ranks, const std::string& needle) {
  try {
    data::BpeTokenizer tokenizer(data::read_gpt2_ranks(ranks));
    FAIL() << "expected data::DataError for " << ranks;
  } catch (const data::DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("scripts/bootstrap.sh"), std::string::npos) << what;
  }
}

TEST(Gpt2Tokenizer, MissingOrMalformedRanksNameTheFileAndLine) {
  test::TempDir dir;
  expect_data_error(dir.file("nope.tiktoken"), dir.file("nope.tiktoken"));

  const std::string real = read_all(data::gpt2_ranks_path());
  auto write_with_line_3 = [&](const std::string& name, const std::string& line) {
    std::istringstream in(real);
    std::ofstream out(dir.file(name), std::ios::binary);
    std::string l;
    for (int n = 1; std::getline(in, l); ++n) out << (n == 3 ? line : l) << "\n";
    return dir.file(name);
  };
  expect_data_error(write_with_line_3("b64.tiktoken", "I@== 2"),
                    "b64.tiktoken:3: the token is not base64");
  expect_data_error(write_with_line_3("rank.tiktoken", "Iw== two"), "rank.tiktoken:3: rank 'two'");
  expect_data_error(write_with_line_3("dup.tiktoken", "Iw== 1"),
                    "dup.tiktoken:3: rank 1 appears twice");
  expect_data_error(write_with_line_3("space.tiktoken", "Iw==2"), "space.tiktoken:3: no space");
  { std::ofstream(dir.file("short.tiktoken")) << "IQ== 0\nIg== 1\n"; }
  expect_data_error(dir.file("short.tiktoken"), "2 ranks, GPT-2 has 50256");
}

TEST(Gpt2Tokenizer, MakeTokenizerReadsTheRanksNamedByTheEnvironment) {
  const std::string real = data::gpt2_ranks_path();
  test::TempDir dir;
  const char* old = std::getenv("TRAINER_GPT2_RANKS");
  const std::string saved = old ? old : "";
  ::setenv("TRAINER_GPT2_RANKS", dir.file("missing.tiktoken").c_str(), 1);
  EXPECT_THROW(
      {
        try {
          data::make_tokenizer("gpt2");
        } catch (const data::DataError& e) {
          EXPECT_NE(std::string(e.what()).find(dir.file("missing.tiktoken")), std::string::npos);
          throw;
        }
      },
      data::DataError);
  ::setenv("TRAINER_GPT2_RANKS", real.c_str(), 1);
  EXPECT_EQ(data::make_tokenizer("gpt2")->encode("Hello world"),
            (std::vector<int64_t>{15496, 995}));
  if (old) {
    ::setenv("TRAINER_GPT2_RANKS", saved.c_str(), 1);
  } else {
    ::unsetenv("TRAINER_GPT2_RANKS");
  }
}

}  // namespace TRAINER_UNITY_ID
