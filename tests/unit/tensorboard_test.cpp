// TensorBoardWriter's files read back here record by record: the TFRecord framing (lengths and
// masked CRC-32Cs) and the Events inside, parsed with the same generated messages. (The e2e test
// reads a run's files with TensorBoard's own reader.) A binary of its own: it must not see
// LibTorch's protobuf headers (src/CMakeLists.txt).

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "train/report/tensorboard.h"
#include "train/report/tensorboard_event.pb.h"

namespace TRAINER_UNITY_ID {

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// The Events of a file, each record's CRCs checked.
std::vector<tensorboard::Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<tensorboard::Event> events;
  size_t at = 0;
  while (at < s.size()) {
    EXPECT_LE(at + 12, s.size()) << "a truncated record header at byte " << at;
    const uint64_t length = le(s, at, 8);
    EXPECT_EQ(le(s, at + 8, 4), train::masked_crc32c(s.data() + at, 8))
        << "length CRC at byte " << at;
    EXPECT_LE(at + 12 + length + 4, s.size()) << "a truncated record at byte " << at;
    const std::string data = s.substr(at + 12, length);
    EXPECT_EQ(le(s, at + 12 + length, 4), train::masked_crc32c(data.data(), data.size()))
        << "data CRC at byte " << at;
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromString(data)) << "record at byte " << at;
    events.push_back(event);
    at += 12 + length + 4;
  }
  return events;
}

TEST(TensorBoard, MaskedCrc32cOfTheStandardCheckString) {
  // CRC-32C("123456789") = 0xE3069283 (the catalogue's check value), then TFRecord's mask.
  const uint32_t crc = 0xE3069283u;
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(train::masked_crc32c("123456789", 9), masked);
}

TEST(TensorBoard, WritesVersionAndSessionStartThenOneEventPerWrite) {
  test::TempDir dir;
  std::string path;
  {
    train::TensorBoardWriter writer(dir.path(), 1);
    path = writer.path();
    writer.write(1, {{"train/loss", 2.5}, {"train/lr", 1e-3}});
    writer.write(10, {{"train/loss", 0.25}});
  }
  EXPECT_EQ(path.rfind(dir.path() + "/events.out.tfevents.", 0), 0u) << path;
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);  // seconds since 1970, not since start
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), 1);
  EXPECT_EQ(events[2].step(), 1);
  ASSERT_EQ(events[2].summary().value_size(), 2);
  EXPECT_EQ(events[2].summary().value(0).tag(), "train/loss");
  EXPECT_FLOAT_EQ(events[2].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].summary().value(1).tag(), "train/lr");
  EXPECT_FLOAT_EQ(events[2].summary().value(1).simple_value(), 1e-3f);
  EXPECT_EQ(events[3].step(), 10);
  EXPECT_FLOAT_EQ(events[3].summary().value(0).simple_value(), 0.25f);
}

TEST(TensorBoard, AResumedRunStartsItsSessionAtItsFirstStep) {
  test::TempDir dir;
  std::string path;
  {
    train::TensorBoardWriter writer(dir.path(), 21);
    path = writer.path();
  }
  const auto events = read_events(path);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), 21);
}

TEST(TensorBoard, ASecondWriterInTheSameDirectoryStartsItsOwnFile) {
  test::TempDir dir;
  train::TensorBoardWriter first(dir.path(), 1);
  train::TensorBoardWriter second(dir.path(), 1);  // the same second, most likely
  EXPECT_NE(first.path(), second.path());
}

TEST(TensorBoard, ADirectoryThatCannotBeCreatedNamesTheKey) {
  test::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  try {
    train::check_tensorboard_dir(dir.file("file") + "/tb");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string expected =
        "log.tensorboard = '" + dir.file("file") + "/tb': cannot create it";
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

}  // namespace TRAINER_UNITY_ID
