// Multiple-choice task files (data/choice_tasks.h): llm.c's eval .bin written here from its
// definition (dev/data/data_common.py, write_evalfile) and JSON Lines through a tokenizer, read
// back example by example; every malformed file named in its error with the example.
#include "data/choice_tasks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>

#include "common/temp_dir.h"
#include "data/errors.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

struct Example {
  std::vector<uint16_t> context;
  std::vector<std::vector<uint16_t>> endings;
  uint16_t label;
};

// llm.c's write_evalfile: the header, then each example's uint16 stream. `tamper` edits the
// stream of words before it is written.
void write_llmc(const std::string& path, const std::vector<Example>& examples,
                int32_t magic = 20240522,
                const std::function<void(std::vector<uint16_t>&)>& tamper = nullptr) {
  std::vector<uint16_t> stream;
  int32_t longest = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    std::vector<uint16_t> s = {65535,
                               0,
                               static_cast<uint16_t>(i),
                               e.label,
                               static_cast<uint16_t>(e.endings.size()),
                               static_cast<uint16_t>(e.context.size())};
    s.insert(s.end(), e.context.begin(), e.context.end());
    for (const auto& ending : e.endings) {
      s.push_back(static_cast<uint16_t>(ending.size()));
      s.insert(s.end(), ending.begin(), ending.end());
    }
    s[1] = static_cast<uint16_t>(2 * s.size());
    longest = std::max<int32_t>(longest, s[1]);
    stream.insert(stream.end(), s.begin(), s.end());
  }
  if (tamper) tamper(stream);
  int32_t header[256] = {magic, 1, static_cast<int32_t>(examples.size()), longest};
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(header, sizeof header, 1, f);
  std::fwrite(stream.data(), 2, stream.size(), f);
  std::fclose(f);
}

const std::vector<Example> kTwo = {{{1, 2, 3}, {{4}, {5, 6}, {7}, {8, 9}}, 1},
                                   {{10}, {{11, 12}, {13}}, 0}};

std::string error_of(const std::string& path, int64_t vocab = 100, int64_t positions = 16) {
  const data::ByteTokenizer bytes;
  try {
    data::read_choice_task(path, &bytes, vocab, positions);
  } catch (const data::DataError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChoiceTasks, ReadsLlmcEvalFile) {
  test::TempDir dir;
  write_llmc(dir.file("hellaswag.bin"), kTwo);
  const data::ChoiceTask t = data::read_choice_task(dir.file("hellaswag.bin"), nullptr, 100, 16);
  EXPECT_EQ(t.name, "hellaswag");
  ASSERT_EQ(t.examples.size(), 2u);
  EXPECT_EQ(t.examples[0].context, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(t.examples[0].endings.size(), 4u);
  EXPECT_EQ(t.examples[0].endings[3], (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(t.examples[0].label, 1);
  EXPECT_EQ(t.examples[1].endings[0], (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(t.examples[1].label, 0);
}

TEST(ChoiceTasks, TokenizesJsonLinesPartByPart) {
  test::TempDir dir;
  std::ofstream(dir.file("mine.jsonl"))
      << R"({"context": "ab", "endings": [" c", "de"], "label": 1})"
      << "\n\n"
      << R"({"context": "x", "endings": ["y", "z"], "label": 0})"
      << "\n";
  const data::ByteTokenizer bytes;
  const data::ChoiceTask t = data::read_choice_task(dir.file("mine.jsonl"), &bytes, 256, 16);
  EXPECT_EQ(t.name, "mine");
  ASSERT_EQ(t.examples.size(), 2u);  // the blank line is skipped
  EXPECT_EQ(t.examples[0].context, (std::vector<int64_t>{'a', 'b'}));
  EXPECT_EQ(t.examples[0].endings[0], (std::vector<int64_t>{' ', 'c'}));
  EXPECT_EQ(t.examples[0].label, 1);
}

TEST(ChoiceTasks, MalformedLlmcFilesNameTheFileAndExample) {
  test::TempDir dir;
  const std::string p = dir.file("t.bin");
  write_llmc(p, kTwo, 20240520);
  EXPECT_THAT(error_of(p), HasSubstr(p + ": bad header: magic 20240520"));
  std::ofstream(dir.file("short.bin")) << "abc";
  EXPECT_THAT(error_of(dir.file("short.bin")), HasSubstr("bad header: 3 bytes"));
  write_llmc(p, kTwo, 20240522, [](auto& s) { s.pop_back(); });
  EXPECT_THAT(error_of(p), HasSubstr(p + ": example 1: the file ends inside it"));
  write_llmc(p, kTwo, 20240522, [](auto& s) { s.push_back(7); });
  EXPECT_THAT(error_of(p), HasSubstr("2 bytes after the 2 examples the header counts"));
  write_llmc(p, kTwo, 20240522, [](auto& s) { s[0] = 1; });
  EXPECT_THAT(error_of(p), HasSubstr("example 0 (byte 1024): no start-of-example marker"));
  write_llmc(p, kTwo, 20240522, [](auto& s) { s[1] += 2; });
  EXPECT_THAT(error_of(p), HasSubstr("example 0: it says 40 bytes but holds 38"));
  write_llmc(p, kTwo, 20240522, [](auto& s) { s[3] = 4; });
  EXPECT_THAT(error_of(p), HasSubstr("example 0: label 4 is out of range for 4 endings"));
  write_llmc(p, kTwo);
  EXPECT_THAT(error_of(p, 13),
              HasSubstr("example 1: ending 1 has id 13, at or above the vocabulary (13)"));
  EXPECT_THAT(error_of(p, 100, 4),
              HasSubstr("example 0: the context (3 tokens) and ending 1 (2 tokens) do not fit the "
                        "model's 4 positions"));
  write_llmc(p, {{{1}, {{2}}, 0}});
  EXPECT_THAT(error_of(p), HasSubstr("example 0: 1 ending(s); a choice needs at least 2"));
}

TEST(ChoiceTasks, MalformedJsonLinesNameTheLine) {
  test::TempDir dir;
  const std::string p = dir.file("t.jsonl");
  std::ofstream(p) << R"({"context": "a", "endings": ["b", "c"], "label": 0})"
                   << "\n"
                   << R"({"context": "a", "endings": ["b", "c"]})"
                   << "\n";
  EXPECT_THAT(error_of(p), HasSubstr(p + ":2: example 1: not {\"context\""));
  std::ofstream(p) << R"({"context": "", "endings": ["b", "c"], "label": 0})"
                   << "\n";
  EXPECT_THAT(error_of(p, 256), HasSubstr(p + ":1: example 0: the context has no tokens"));
  std::ofstream(p) << R"({"context": "a", "endings": ["b", ""], "label": 0})"
                   << "\n";
  EXPECT_THAT(error_of(p, 256), HasSubstr("example 0: ending 1 has no tokens"));
  std::ofstream(p) << "\n";
  EXPECT_THAT(error_of(p, 256), HasSubstr(p + ": no examples"));
  EXPECT_THAT(error_of(dir.file("missing.jsonl")), HasSubstr("cannot open the file"));
  std::ofstream(p) << R"({"context": "a", "endings": ["b", "c"], "label": 0})"
                   << "\n";
  try {
    data::read_choice_task(p, nullptr, 256, 16);
    ADD_FAILURE() << "a JSON Lines task read without a tokenizer";
  } catch (const data::DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("a JSON Lines task needs the run's tokenizer"));
  }
}

}  // namespace TRAINER_UNITY_ID
