#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace TRAINER_UNITY_ID {

TEST(TokenizerBytes, EncodesEachUtf8ByteAndDecodesBackByteForByte) {
  const auto tok = data::make_tokenizer("bytes");
  const std::string text = "héllo\n\t  世界 <|endoftext|>";
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xC3);  // the first byte of é
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_FALSE(tok->end_of_text().has_value());
}

TEST(TokenizerBytes, RefusesAnIdThatIsNotAByte) {
  const auto tok = data::make_tokenizer("bytes");
  try {
    tok->decode({104, 256});
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnknownEncodingNamesItAndTheKnownOnes) {
  try {
    data::make_tokenizer("sentencepiece");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sentencepiece"), std::string::npos) << what;
    EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  }
}

}  // namespace TRAINER_UNITY_ID
