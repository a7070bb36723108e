// Token shards: nanoGPT's flat uint16 files and llm.c's headed ones, windows that never cross a
// shard, the validation split, and every malformed file named in its error.
#include "data/token_shards.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "common/error_of.h"
#include "common/temp_dir.h"
#include "data/errors.h"
#include "data/readers.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

void write_bytes(const std::string& path, const void* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (n > 0) std::fwrite(data, 1, n, f);
  std::fclose(f);
}

// Tokens first, first + 1, ... (mod 1000).
void write_shard(const std::string& path, int64_t first, int64_t count, bool llmc = false,
                 int32_t claimed = -1) {
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    tokens[static_cast<size_t>(i)] = static_cast<uint16_t>((first + i) % 1000);
  std::vector<char> bytes;
  if (llmc) {
    int32_t header[256] = {20240520, 1, claimed >= 0 ? claimed : static_cast<int32_t>(count)};
    bytes.insert(bytes.end(), reinterpret_cast<char*>(header),
                 reinterpret_cast<char*>(header) + sizeof header);
  }
  bytes.insert(bytes.end(), reinterpret_cast<char*>(tokens.data()),
               reinterpret_cast<char*>(tokens.data()) + 2 * tokens.size());
  write_bytes(path, bytes.data(), bytes.size());
}

std::string error_of(const std::function<void()>& fn) {
  return test::error_of<data::DataError>(fn);
}

TEST(TokenShards, WindowsShiftTargetsByOneAndNeverCrossShards) {
  test::TempDir dir;
  write_shard(dir.path() + "/train_a.bin", 0, 21);          // (21 - 1) / 4 = 5 windows
  write_shard(dir.path() + "/train_b.bin", 500, 10, true);  // llm.c's: (10 - 1) / 4 = 2 windows
  write_shard(dir.path() + "/val_a.bin", 900, 9);
  data::DataOptions o;
  o.path = dir.path();
  o.context = 4;
  o.vocab_size = 1000;
  auto ds = data::make_token_dataset(o);
  EXPECT_EQ(ds->size(), 7);
  EXPECT_EQ(ds->shape().context, 4);
  EXPECT_EQ(ds->shape().vocab_size, 1000);
  const auto b = ds->get(at::tensor({1, 4, 5, 6}, at::kLong));
  EXPECT_TRUE(at::equal(b.inputs[0], at::tensor({4, 5, 6, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(b.targets[0], at::tensor({5, 6, 7, 8}, at::kLong)));
  EXPECT_TRUE(at::equal(b.targets[1], at::tensor({17, 18, 19, 20}, at::kLong)));  // last of shard a
  EXPECT_TRUE(
      at::equal(b.inputs[2], at::tensor({500, 501, 502, 503}, at::kLong)));  // after the header
  EXPECT_TRUE(at::equal(b.targets[3], at::tensor({505, 506, 507, 508}, at::kLong)));
  const auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 2);
  EXPECT_TRUE(at::equal(val->get(at::tensor({1}, at::kLong)).inputs[0],
                        at::tensor({904, 905, 906, 907}, at::kLong)));
}

TEST(TokenShards, AShortLastShardHoldsNoWindowsButTheRestTrain) {
  test::TempDir dir;
  write_shard(dir.path() + "/train_0.bin", 0, 41);  // 10 windows of 4
  write_shard(dir.path() + "/train_1.bin", 0, 3);   // none: shorter than a window
  data::DataOptions o;
  o.path = dir.path();
  o.context = 4;
  o.vocab_size = 1000;
  EXPECT_EQ(data::make_token_dataset(o)->size(), 10);
}

TEST(TokenShards, ValPathAndASingleFile) {
  test::TempDir dir, val;
  write_shard(dir.path() + "/tokens.bin", 0, 50);
  write_shard(val.path() + "/v.bin", 0, 50);
  data::DataOptions o;
  o.path = dir.path() + "/tokens.bin";
  o.val_path = val.path();
  o.context = 7;
  o.vocab_size = 100;
  auto ds = data::make_token_dataset(o);
  EXPECT_EQ(ds->size(), 7);
  ASSERT_NE(ds->validation(), nullptr);
  EXPECT_EQ(ds->validation()->size(), 7);
}

TEST(TokenShards, ConcurrentReadsEqualSequentialOnes) {
  test::TempDir dir;
  write_shard(dir.path() + "/train.bin", 3, 5000);
  data::TokenShardDataset ds({dir.path() + "/train.bin"}, 16, 1000);
  const at::Tensor idx = at::randperm(ds.size(), at::kLong);
  const auto expected = ds.get(idx).inputs;
  std::vector<std::thread> threads;
  std::vector<at::Tensor> got(4);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = ds.get(idx).inputs; });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_TRUE(at::equal(g, expected));
}

TEST(TokenShards, MalformedFilesAreNamed) {
  test::TempDir dir;
  const std::string odd = dir.path() + "/odd.bin", trunc = dir.path() + "/trunc.bin",
                    empty = dir.path() + "/empty.bin", shorter = dir.path() + "/short.bin",
                    version = dir.path() + "/v2.bin";
  std::vector<char> bytes(4097, 1);
  write_bytes(odd, bytes.data(), bytes.size());
  write_shard(trunc, 0, 100, /*llmc=*/true, /*claimed=*/10000);
  write_bytes(empty, nullptr, 0);
  write_shard(shorter, 0, 8);
  int32_t header[256] = {20240520, 2, 4};
  write_bytes(version, header, sizeof header);
  auto open = [](const std::string& f, int64_t context = 8) {
    return [f, context] { data::TokenShardDataset ds({f}, context, 1000); };
  };
  EXPECT_THAT(error_of(open(odd)), HasSubstr(odd + ": 4097 bytes, an odd byte count"));
  EXPECT_THAT(
      error_of(open(trunc)),
      HasSubstr(trunc +
                ": truncated: the header (byte offset 8) says 10000 tokens, the file holds 100"));
  EXPECT_THAT(error_of(open(empty)), HasSubstr(empty + ": the token shard is empty"));
  EXPECT_THAT(
      error_of(open(shorter)),
      HasSubstr(shorter +
                ": 8 tokens, fewer than data.context + 1 = 9: a window longer than the data"));
  EXPECT_THAT(error_of(open(version)),
              HasSubstr(version + ": byte offset 4: llm.c header version 2"));
  EXPECT_THAT(error_of(open(dir.path() + "/missing.bin")), HasSubstr("missing.bin: cannot open"));
  test::TempDir none;
  data::DataOptions o;
  o.path = none.path();
  o.context = 8;
  o.vocab_size = 1000;
  EXPECT_THAT(error_of([&] { data::make_token_dataset(o); }),
              HasSubstr("holds no training shards"));
}

TEST(TokenShards, ATokenOutsideTheVocabularyIsRefusedAtOpenNamingFileAndOffset) {
  test::TempDir dir;
  const std::string path = dir.path() + "/train.bin", val = dir.path() + "/val.bin";
  write_shard(path, 0, 100, /*llmc=*/true);
  // Tokens 50..99 are out of range; the first, 50, sits at byte 1024 + 2 * 50.
  EXPECT_THAT(
      error_of([&] { data::TokenShardDataset ds({path}, 10, 50); }),
      HasSubstr(path + ": byte offset 1124: token id 50 is not below data.vocab_size = 50"));
  // The validation split is checked too: its tokens 40..69 pass 50 at the 11th.
  write_shard(path, 0, 40);
  write_shard(val, 40, 30);
  EXPECT_THAT(error_of([&] { data::TokenShardDataset ds({path}, 10, 50, {val}); }),
              HasSubstr(val + ": byte offset 20: token id 50 is not below data.vocab_size = 50"));
  EXPECT_NO_THROW(data::TokenShardDataset ds({path}, 10, 50));
}

// llm.c's Llama 3 shards: magic 20240801, version 7, uint32 tokens.
void write_wide_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                      int32_t version = 7) {
  int32_t header[256] = {20240801, version, static_cast<int32_t>(tokens.size())};
  std::vector<char> bytes(reinterpret_cast<char*>(header),
                          reinterpret_cast<char*>(header) + sizeof header);
  bytes.insert(bytes.end(), reinterpret_cast<const char*>(tokens.data()),
               reinterpret_cast<const char*>(tokens.data()) + 4 * tokens.size());
  write_bytes(path, bytes.data(), bytes.size());
}

TEST(TokenShards, Uint32ShardsReadBackAndAreChecked) {
  test::TempDir dir;
  const std::string path = dir.path() + "/train.bin";
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 41; ++i) tokens.push_back(128255 - 3000 * i);
  write_wide_shard(path, tokens);
  data::TokenShardDataset ds({path}, 8, 128256);
  EXPECT_EQ(ds.size(), 5);
  const auto b = ds.get(at::tensor({1, 4}, at::kLong));
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(b.inputs[0][j].item<int64_t>(), tokens[8 + j]);
    EXPECT_EQ(b.targets[1][j].item<int64_t>(), tokens[33 + j]);
  }
  EXPECT_THAT(
      error_of([&] { data::TokenShardDataset d({path}, 8, 128255); }),
      HasSubstr(path +
                ": byte offset 1024: token id 128255 is not below data.vocab_size = 128255"));
  write_wide_shard(path, tokens, 1);
  EXPECT_THAT(error_of([&] { data::TokenShardDataset d({path}, 8, 128256); }),
              HasSubstr(path + ": byte offset 4: llm.c header version 1 after magic 20240801; only "
                               "version 7 (uint32 tokens)"));
}

}  // namespace TRAINER_UNITY_ID
