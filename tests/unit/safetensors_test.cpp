// The safetensors reader and writer: round trips in every supported dtype, a file written by
// hand from the format's description, and every kind of bad file, whose message names the file.
// The ranged reader (SafetensorsRangeReader): exactly the bytes of the elements asked for, and
// errors naming the file and the tensor.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <unistd.h>

#include "common/temp_dir.h"
#include "io/safetensors.h"

namespace TRAINER_UNITY_ID {

using io::read_safetensors;
using io::SafetensorsError;
using io::write_safetensors;
using ::testing::AllOf;
using ::testing::HasSubstr;

class Safetensors : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  // A file of the 8-byte length of `header`, `header`, then `data`.
  std::string raw(const std::string& name, const std::string& header,
                  const std::string& data = "") {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
    out << header << data;
    return p;
  }

  // The message of the SafetensorsError reading `p` throws; a failure if it throws none.
  static std::string read_error(const std::string& p) {
    try {
      read_safetensors(p);
    } catch (const SafetensorsError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no SafetensorsError for " << p;
    return "";
  }

  test::TempDir dir_;
};

TEST_F(Safetensors, RoundTripEveryDtype) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor base = at::arange(-6, 6, f64).div(4).view({3, 4});
  std::map<std::string, at::Tensor> tensors = {
      {"f64", base},
      {"f32", base.to(at::kFloat)},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"i64", at::arange(-3, 3, f64.dtype(at::kLong))},
      {"i32", at::arange(-3, 3, f64.dtype(at::kInt)).view({2, 3})},
      {"i16", at::arange(-3, 3, f64.dtype(at::kShort))},
      {"i8", at::arange(-3, 3, f64.dtype(at::kChar))},
      {"u8", at::arange(250, 256, f64.dtype(at::kByte))},
      {"bool", at::tensor({1, 0, 1}, f64.dtype(at::kLong)).to(at::kBool)},
      {"scalar", at::full({}, 2.5, f64.dtype(at::kFloat))},
      {"empty", at::empty({0, 7}, f64.dtype(at::kFloat))},
      {"strided", base.to(at::kFloat).t()},  // not contiguous
  };
  write_safetensors(path("all.safetensors"), tensors, {{"format", "pt"}});
  const auto back = read_safetensors(path("all.safetensors"));
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const at::Tensor& r = back.at(name);
    EXPECT_EQ(r.scalar_type(), t.scalar_type());
    EXPECT_EQ(r.sizes(), t.sizes());
    EXPECT_TRUE(at::equal(r, t));
  }
  // F16 and BF16 hold these quarter values exactly.
  EXPECT_TRUE(at::equal(back.at("bf16").to(at::kDouble), base));
  EXPECT_TRUE(at::equal(back.at("f16").to(at::kDouble), base));
}

TEST_F(Safetensors, WriterFollowsTheLayout) {
  write_safetensors(path("w.safetensors"), {{"x", at::ones({3}, at::kFloat)}});
  std::ifstream in(path("w.safetensors"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);  // padded, so data starts aligned
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_THAT(bytes.substr(8, n), HasSubstr("\"data_offsets\":[0,12]"));
}

TEST_F(Safetensors, ReadsAFileWrittenByHand) {
  // Two F32 values and one BF16 (0x3fc0 = 1.5), with metadata and padding spaces in the header.
  std::string data;
  const float values[2] = {1.0f, -2.0f};
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  data.append("\xc0\x3f", 2);
  const std::string p =
      raw("hand.safetensors",
          R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
          R"("b":{"dtype":"BF16","shape":[1,1],"data_offsets":[8,10]}}   )",
          data);
  const auto t = read_safetensors(p);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_TRUE(at::equal(t.at("a"), at::tensor({1.0f, -2.0f})));
  EXPECT_EQ(t.at("b").scalar_type(), at::kBFloat16);
  EXPECT_EQ(t.at("b").sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(t.at("b").item<float>(), 1.5f);
}

TEST_F(Safetensors, MissingFile) {
  const std::string p = path("nope.safetensors");
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("cannot open")));
}

TEST_F(Safetensors, ShorterThanTheLengthField) {
  const std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("truncated")));
}

TEST_F(Safetensors, HeaderLongerThanTheFile) {
  std::string p = path("cut.safetensors");
  {
    std::ofstream out(p, std::ios::binary);
    const char len[8] = {100, 0, 0, 0, 0, 0, 0, 0};
    out.write(len, 8);
    out << "{}";
  }
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("truncated"), HasSubstr("100 bytes")));
}

TEST_F(Safetensors, DataCutShort) {
  write_safetensors(path("full.safetensors"), {{"w", at::ones({4, 4}, at::kFloat)}});
  const std::string p = path("full.safetensors");
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(in.tellg()) - 5), 0);
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("out of range")));
}

TEST_F(Safetensors, BadJson) {
  const std::string p = raw("json.safetensors", R"({"a": {"dtype": "F32",)");
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("not valid JSON")));
  const std::string q = raw("list.safetensors", "[1, 2]");
  EXPECT_THAT(read_error(q), AllOf(HasSubstr(q), HasSubstr("not a JSON object")));
  // A number beyond a double (found by the safetensors_header fuzz target: nlohmann's
  // out_of_range escaped the reader, exit 1 naming no file).
  const std::string r =
      raw("huge.safetensors", R"({"w":{"dtype":"F32","shape":[2,1e4003],"data_offsets":[0,8]}})");
  EXPECT_THAT(read_error(r),
              AllOf(HasSubstr(r), HasSubstr("not valid JSON"), HasSubstr("number overflow")));
}

TEST_F(Safetensors, UnknownDtype) {
  const std::string p = raw("dtype.safetensors",
                            R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "xx");
  EXPECT_THAT(read_error(p),
              AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("unknown dtype 'F8_E4M3'")));
}

TEST_F(Safetensors, OffsetsOutOfRange) {
  const std::string p =
      raw("range.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          "12345678");
  EXPECT_THAT(read_error(p),
              AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("[4, 12] are out of range"),
                    HasSubstr("holds 8 bytes")));
  const std::string q = raw(
      "order.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", "12345678");
  EXPECT_THAT(read_error(q), AllOf(HasSubstr(q), HasSubstr("out of range")));
}

TEST_F(Safetensors, SizeDisagreesWithShape) {
  const std::string p = raw(
      "size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678");
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("needs 12")));
}

TEST_F(Safetensors, MalformedEntries) {
  const std::string p =
      raw("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})");
  EXPECT_THAT(read_error(p), AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("shape")));
  const std::string q = raw("nooff.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", "1234");
  EXPECT_THAT(read_error(q), AllOf(HasSubstr(q), HasSubstr("'w'"), HasSubstr("data_offsets")));
  const std::string r =
      raw("nodtype.safetensors", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "1234");
  EXPECT_THAT(read_error(r), AllOf(HasSubstr(r), HasSubstr("'w'"), HasSubstr("dtype")));
}

TEST_F(Safetensors, RangeReaderReadsExactlyTheElementsAskedFor) {
  // Two tensors, so the second's data does not start at the data section's start.
  const at::Tensor a = at::arange(10, at::kFloat).mul(0.5);
  const at::Tensor b = at::arange(12, at::kBFloat16).sub(6).view({3, 4});
  const std::string p = path("ranged.safetensors");
  write_safetensors(p, {{"a", a}, {"b", b}});
  io::SafetensorsRangeReader reader(p);
  EXPECT_TRUE(reader.has("b"));
  EXPECT_FALSE(reader.has("c"));
  EXPECT_EQ(reader.info("b").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(reader.info("b").numel, 12);
  const int64_t before = io::safetensors_bytes_read();
  at::Tensor out = at::full({4}, -1.0f);
  reader.read("a", 3, 4, out);
  EXPECT_TRUE(at::equal(out, a.narrow(0, 3, 4)));
  // Row-major across rows of b: elements 2..8 of the flat tensor, bit for bit.
  at::Tensor bout = at::zeros({7}, at::kBFloat16);
  reader.read("b", 2, 7, bout);
  EXPECT_TRUE(at::equal(bout, b.reshape({-1}).narrow(0, 2, 7)));
  at::Tensor last = at::zeros({1}, at::kBFloat16);
  reader.read("b", 11, 1, last);
  EXPECT_TRUE(at::equal(last, b.reshape({-1}).narrow(0, 11, 1)));
  reader.read("a", 10, 0, at::empty({0}));  // an empty range at the end
  // Only those bytes were read: 4 floats, 8 bf16 values.
  EXPECT_EQ(reader.bytes_read(), 4 * 4 + 8 * 2);
  EXPECT_EQ(io::safetensors_bytes_read() - before, 4 * 4 + 8 * 2);
}

TEST_F(Safetensors, RangeReaderRefusesOutOfRangeBadKeysAndBadFiles) {
  const std::string p = path("ranged.safetensors");
  write_safetensors(p, {{"w", at::arange(6, at::kFloat)}});
  io::SafetensorsRangeReader reader(p);
  const auto error_of = [&](const std::string& key, int64_t offset, int64_t count,
                            const at::Tensor& out) {
    try {
      reader.read(key, offset, count, out);
    } catch (const SafetensorsError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no SafetensorsError for " << key << " " << offset << " " << count;
    return std::string();
  };
  EXPECT_THAT(error_of("w", 4, 3, at::empty({3})),
              AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("[4, 7)"), HasSubstr("6 elements")));
  EXPECT_THAT(error_of("w", -1, 1, at::empty({1})), AllOf(HasSubstr(p), HasSubstr("'w'")));
  EXPECT_THAT(error_of("v", 0, 1, at::empty({1})),
              AllOf(HasSubstr(p), HasSubstr("has no tensor 'v'")));
  EXPECT_THAT(error_of("w", 0, 2, at::empty({2}, at::kDouble)),
              AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("Double")));
  EXPECT_THAT(error_of("w", 0, 2, at::empty({3})), AllOf(HasSubstr(p), HasSubstr("'w'")));
  EXPECT_EQ(reader.bytes_read(), 0);
  // The header's checks are read_safetensors's.
  const std::string q = raw("bad.safetensors",
                            R"({"w":{"dtype":"F32","shape":[2],)"
                            R"("data_offsets":[0,8]}})",
                            "1234");
  try {
    io::SafetensorsRangeReader bad(q);
    ADD_FAILURE() << "a truncated file opened";
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(q), HasSubstr("'w'"), HasSubstr("out of range")));
  }
  // A file cut short after it was opened: the read says so, naming the file and the tensor.
  ASSERT_EQ(::truncate(p.c_str(), 8 + 16), 0);
  EXPECT_THAT(error_of("w", 0, 6, at::empty({6})),
              AllOf(HasSubstr(p), HasSubstr("'w'"), HasSubstr("ends early")));
}

TEST_F(Safetensors, WriterRejectsUnsupportedDtypes) {
  const std::string p = path("complex.safetensors");
  try {
    write_safetensors(p, {{"z", at::zeros({2}, at::kComplexFloat)}});
    FAIL() << "no SafetensorsError";
  } catch (const SafetensorsError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(p), HasSubstr("'z'")));
  }
}

}  // namespace TRAINER_UNITY_ID
