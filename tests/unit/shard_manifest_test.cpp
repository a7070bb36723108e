// The sharded checkpoint manifest (io/shard_manifest.h): layout checks, the reader's plan at
// another world size, and missing or damaged shard files refused by name.
#include "io/shard_manifest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"

namespace TRAINER_UNITY_ID {

namespace fs = std::filesystem;

// A 10-element tensor "w" split among `world` ranks as ddp/shard.h pads a bucket: blocks of
// ceil(10 / world), the last rank's block clipped to the tensor (the padding is not a piece).
io::ShardManifest two_way_manifest(int world) {
  io::ShardManifest m;
  m.world_size = world;
  m.shard_mode = "optimizer";
  m.step = 7;
  m.global_batch_size = 8;
  m.seed = 3;
  m.config = "model: {name: mlp}\n";
  m.tensors["w"] = {"F32", {2, 5}};
  m.tensors["b"] = {"F32", {3}};
  const int64_t size = (10 + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    io::ShardFile f{io::shard_file_name(r), r, 0, "crc32:00000000", {}};
    const int64_t begin = r * size;
    const int64_t end = std::min<int64_t>(begin + size, 10);
    if (begin < end) f.pieces.push_back({"w", begin, end - begin, "block.0", 0});
    if (r == 0) f.pieces.push_back({"b", 0, 3, "b", 0});
    m.files.push_back(f);
  }
  return m;
}

TEST(ShardManifest, NamesAreZeroPadded) {
  EXPECT_EQ(io::step_dir_name(100), "step_000100");
  EXPECT_EQ(io::shard_file_name(3), "rank_00003.safetensors");
}

TEST(ShardManifest, RoundTripsThroughJson) {
  const io::ShardManifest m = two_way_manifest(3);
  const io::ShardManifest back = io::parse_manifest(io::manifest_to_json(m), "m.json");
  EXPECT_EQ(back.world_size, 3);
  EXPECT_EQ(back.shard_mode, "optimizer");
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.global_batch_size, 8);
  EXPECT_EQ(back.seed, 3u);
  EXPECT_EQ(back.config, m.config);
  ASSERT_EQ(back.files.size(), 3u);
  EXPECT_EQ(back.files[2].pieces[0].offset, 8);
  EXPECT_EQ(back.files[2].pieces[0].count, 2);
  EXPECT_EQ(back.tensors.at("w").shape, (std::vector<int64_t>{2, 5}));
}

TEST(ShardManifest, RefusesAMissingOrDoubledRange) {
  io::ShardManifest m = two_way_manifest(2);
  m.files[1].pieces.clear();  // elements 5..9 of w held by no file
  try {
    io::check_layout(m, "m.json");
    FAIL() << "a missing range was accepted";
  } catch (const io::ShardManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' from 5 are missing"), std::string::npos) << e.what();
  }
  m = two_way_manifest(2);
  m.files[1].pieces[0].offset = 4;  // [4, 10): element 4 held twice, none missing
  m.files[1].pieces[0].count = 6;
  try {
    io::check_layout(m, "m.json");
    FAIL() << "a doubled range was accepted";
  } catch (const io::ShardManifestError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' from 4 are held twice"), std::string::npos)
        << e.what();
  }
  m = two_way_manifest(2);
  m.files[0].pieces.push_back({"ghost", 0, 1, "ghost", 0});
  EXPECT_THROW(io::check_layout(m, "m.json"), io::ShardManifestError);
}

TEST(ShardManifest, RefusesAnotherFormatOrBrokenJson) {
  EXPECT_THROW(io::parse_manifest("{\"format\": \"x\"}", "m.json"), io::ShardManifestError);
  EXPECT_THROW(io::parse_manifest("{not json", "m.json"), io::ShardManifestError);
}

// A tensor's element order goes into the manifest (as v2) and back; a manifest without one stays
// v1, which older readers take; an order that is not a permutation of the dimensions is refused.
TEST(ShardManifest, RecordsAnElementOrder) {
  io::ShardManifest m = two_way_manifest(2);
  EXPECT_NE(io::manifest_to_json(m).find(io::kShardManifestFormat), std::string::npos);
  EXPECT_TRUE(io::parse_manifest(io::manifest_to_json(m), "m.json").tensors.at("w").order.empty());
  m.tensors["w"].order = {1, 0};
  const std::string text = io::manifest_to_json(m);
  EXPECT_NE(text.find(io::kShardManifestFormatV2), std::string::npos);
  const io::ShardManifest back = io::parse_manifest(text, "m.json");
  EXPECT_EQ(back.tensors.at("w").order, (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(back.tensors.at("b").order.empty());
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0}, {1, 1}, {0, 2}}) {
    m.tensors["w"].order = bad;
    try {
      io::check_layout(m, "m.json");
      FAIL() << "order of " << bad.size() << " accepted";
    } catch (const io::ShardManifestError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a permutation of its 2 dimensions"),
                std::string::npos)
          << e.what();
    }
  }
}

// element_order: row-major is empty; channels-last NCHW is N, H, W, C; dimensions of size 1 do
// not change the order, so a channels-last 1x1 kernel is row-major; strides with gaps or overlaps
// are refused.
TEST(ShardManifest, ElementOrderOfStrides) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(io::element_order({8, 4, 3, 3}, {36, 9, 3, 1}), V{});
  EXPECT_EQ(io::element_order({8, 4, 3, 3}, {36, 1, 12, 4}), (V{0, 2, 3, 1}));
  EXPECT_EQ(io::element_order({8, 4, 1, 1}, {4, 1, 4, 4}), V{});
  EXPECT_EQ(io::element_order({8, 4, 1, 1}, {4, 1, 1, 1}), V{});
  EXPECT_EQ(io::element_order({1, 4, 3, 3}, {36, 1, 12, 4}), (V{0, 2, 3, 1}));
  EXPECT_EQ(io::element_order({1, 4, 3, 3}, {1, 1, 12, 4}), (V{0, 2, 3, 1}));
  EXPECT_EQ(io::element_order({5, 3}, {1, 5}), (V{1, 0}));
  EXPECT_EQ(io::element_order({}, {}), V{});
  EXPECT_THROW(io::element_order({5, 3}, {4, 1}), std::invalid_argument);  // a gap
  EXPECT_THROW(io::element_order({5, 3}, {1, 1}), std::invalid_argument);  // overlapping
}

// A reader at 3 ranks of a checkpoint written by 2: rank 1 of 3 owns elements [4, 8) of w,
// which lie in both files.
TEST(ShardManifest, PlansAReadAcrossFilesAtAnotherWorldSize) {
  const io::ShardManifest m = two_way_manifest(2);
  const auto plan = io::pieces_for(m, "w", 4, 4);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].file, "rank_00000.safetensors");
  EXPECT_EQ(plan[0].piece.offset, 4);
  EXPECT_EQ(plan[0].piece.count, 1);
  EXPECT_EQ(plan[0].piece.key_offset, 4);
  EXPECT_EQ(plan[1].file, "rank_00001.safetensors");
  EXPECT_EQ(plan[1].piece.offset, 5);
  EXPECT_EQ(plan[1].piece.count, 3);
  EXPECT_EQ(plan[1].piece.key_offset, 0);
  EXPECT_THROW(io::pieces_for(m, "w", 8, 3), io::ShardManifestError);
  EXPECT_THROW(io::pieces_for(m, "nope", 0, 1), io::ShardManifestError);
}

class ShardFiles : public ::testing::Test {
 protected:
  // A fresh flat directory per test (test::TempDir: not std::filesystem::remove_all, which binds
  // to the LibTorch wheel's crashing copy).
  void SetUp() override {
    dir_ = tmp_.path();
    m_ = two_way_manifest(2);
    for (auto& f : m_.files) {
      write(f.file, "shard bytes of " + f.file);
      f.bytes = static_cast<int64_t>(fs::file_size(dir_ / f.file));
      f.crc32 = io::file_crc32((dir_ / f.file).string());
    }
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string refusal() {
    try {
      io::verify_shard_files(dir_.string(), m_);
    } catch (const io::ShardFileDamaged& e) {
      return e.what();
    }
    return "";
  }
  test::TempDir tmp_;
  fs::path dir_;
  io::ShardManifest m_;
};

TEST_F(ShardFiles, AcceptsIntactFiles) { EXPECT_EQ(refusal(), ""); }

TEST_F(ShardFiles, RefusesAMissingFileByName) {
  fs::remove(dir_ / "rank_00001.safetensors");
  const std::string why = refusal();
  EXPECT_NE(why.find("rank_00001.safetensors: missing shard file"), std::string::npos) << why;
}

TEST_F(ShardFiles, RefusesAFileWithOtherBytesByName) {
  write("rank_00000.safetensors", "shard bytes of rank_00000.safetensorX");  // same size
  const std::string why = refusal();
  EXPECT_NE(why.find("rank_00000.safetensors: shard file is damaged"), std::string::npos) << why;
}

TEST_F(ShardFiles, RefusesATruncatedFileByName) {
  write("rank_00001.safetensors", "shard");
  const std::string why = refusal();
  EXPECT_NE(why.find("rank_00001.safetensors: shard file has 5 bytes"), std::string::npos) << why;
}

TEST_F(ShardFiles, ReadsTheManifestOrSaysItIsMissing) {
  EXPECT_THROW(io::read_manifest(dir_.string()), io::ShardFileDamaged);
  write(io::kShardManifestName, io::manifest_to_json(m_));
  EXPECT_EQ(io::read_manifest(dir_.string()).files[1].crc32, m_.files[1].crc32);
}

}  // namespace TRAINER_UNITY_ID
