// The PNG folder reader: crops at the hashed position, deterministic samples (across threads),
// noise and downscaling, the validation split, and errors naming the file or key.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <png.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error_of.h"
#include "common/temp_dir.h"
#include "data/errors.h"
#include "data/image_folder.h"
#include "data/readers.h"

namespace TRAINER_UNITY_ID {

using data::DataError;
using data::DataOptions;
using data::ImageFolderDataset;

// Writes an RGB PNG whose pixel (x, y) is pixel(x, y) -> {r, g, b}.
void write_png(const std::string& path, int width, int height,
               const std::function<std::array<uint8_t, 3>(int, int)>& pixel) {
  std::vector<uint8_t> buffer(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const auto rgb = pixel(x, y);
      std::memcpy(&buffer[(static_cast<size_t>(y) * width + x) * 3], rgb.data(), 3);
    }
  }
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  if (png_image_write_to_file(&image, path.c_str(), 0, buffer.data(), 0, nullptr) == 0) {
    throw std::runtime_error(std::string("png write failed: ") + image.message);
  }
}

// Pixel (x, y) encodes x in red and y in green (images up to 256 pixels a side).
void write_coordinate_png(const std::string& path, int width, int height) {
  write_png(path, width, height, [](int x, int y) {
    return std::array<uint8_t, 3>{static_cast<uint8_t>(x), static_cast<uint8_t>(y), 90};
  });
}

void write_flat_png(const std::string& path, int width, int height, uint8_t value) {
  write_png(path, width, height, [value](int, int) {
    return std::array<uint8_t, 3>{value, value, value};
  });
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

DataOptions options(const std::string& path, int64_t patch, int64_t scale = 1, double noise = 0.0) {
  DataOptions o;
  o.dataset = "images";
  o.path = path;
  o.patch_size = patch;
  o.scale = scale;
  o.noise_std = noise;
  o.crops_per_image = 8;
  o.val_fraction = 0.0;
  o.seed = 1234;
  return o;
}

at::Tensor all_indices(const data::Dataset& ds) { return at::arange(ds.size(), at::kLong); }

// The DataError message of `fn`, or "" when it throws none.
std::string error_of(const std::function<void()>& fn) {
  return test::error_of<data::DataError>(fn);
}

TEST(ImageFolder, TargetIsTheSourceCropAtTheHashedPosition) {
  test::TempDir dir;
  write_coordinate_png(dir.file("a.png"), 100, 80);
  write_coordinate_png(dir.file("b.png"), 70, 90);
  auto ds = data::make_image_dataset(options(dir.path(), 16));
  ASSERT_EQ(ds->size(), 16);
  EXPECT_EQ(ds->shape().channels, 3);
  EXPECT_EQ(ds->shape().scale, 1);
  const auto* images = dynamic_cast<const ImageFolderDataset*>(ds.get());
  ASSERT_NE(images, nullptr);

  const data::Batch b = ds->get(all_indices(*ds));
  ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{16, 3, 16, 16}));
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{16, 3, 16, 16}));
  std::set<std::pair<int64_t, int64_t>> origins;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const at::Tensor t = b.targets[i];
    EXPECT_GE(t.min().item<float>(), 0.0f);
    EXPECT_LE(t.max().item<float>(), 1.0f);
    // Where the crop came from, read back from the pixels that encode their coordinates.
    const at::Tensor px = (t * 255.0f).round().to(at::kLong);
    const int64_t x0 = px[0][0][0].item<int64_t>();
    const int64_t y0 = px[1][0][0].item<int64_t>();
    EXPECT_EQ(std::make_pair(x0, y0), images->crop_origin(i)) << "sample " << i;
    const int64_t w = i < 8 ? 100 : 70, h = i < 8 ? 80 : 90;
    EXPECT_LE(x0 + 16, w);
    EXPECT_LE(y0 + 16, h);
    const at::Tensor xs = at::arange(x0, x0 + 16, at::kLong).view({1, 16}).expand({16, 16});
    const at::Tensor ys = at::arange(y0, y0 + 16, at::kLong).view({16, 1}).expand({16, 16});
    EXPECT_TRUE(at::equal(px[0], xs)) << "sample " << i;
    EXPECT_TRUE(at::equal(px[1], ys)) << "sample " << i;
    EXPECT_TRUE((px[2] == 90).all().item<bool>());
    origins.insert({x0, y0});
    // No noise at noise_std 0: the input is the target.
    EXPECT_TRUE(at::equal(b.inputs[i], b.targets[i]));
  }
  EXPECT_GT(origins.size(), 8u);  // crops are spread, not one position
}

TEST(ImageFolder, SameIndexSameSampleAcrossCallsAndThreads) {
  test::TempDir dir;
  write_coordinate_png(dir.file("a.png"), 64, 64);
  write_coordinate_png(dir.file("b.png"), 48, 60);
  auto ds = data::make_image_dataset(options(dir.path(), 32, 1, 0.2));
  const at::Tensor idx = at::tensor(std::vector<int64_t>{5, 0, 13, 5, 9}, at::kLong);
  const data::Batch ref = ds->get(idx);
  const data::Batch again = ds->get(idx);
  EXPECT_TRUE(at::equal(ref.inputs, again.inputs));
  EXPECT_TRUE(at::equal(ref.targets, again.targets));
  // The repeated index inside one batch matches itself too, noise included.
  EXPECT_TRUE(at::equal(ref.inputs[0], ref.inputs[3]));
  EXPECT_FALSE(at::equal(ref.inputs, ref.targets));  // noise was added

  std::vector<data::Batch> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 5; ++r) got[t] = ds->get(idx);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& g : got) {
    EXPECT_TRUE(at::equal(g.inputs, ref.inputs));
    EXPECT_TRUE(at::equal(g.targets, ref.targets));
  }
  // A second dataset over the same files and seed gives the same samples (another rank or run).
  auto other = data::make_image_dataset(options(dir.path(), 32, 1, 0.2));
  const data::Batch o = other->get(idx);
  EXPECT_TRUE(at::equal(o.inputs, ref.inputs));
}

TEST(ImageFolder, NoiseStdMatchesNoiseStdAtScaleOne) {
  test::TempDir dir;
  write_flat_png(dir.file("grey.png"), 64, 64, 128);  // mid-grey: clamping barely matters
  DataOptions o = options(dir.path(), 32, 1, 0.1);
  o.crops_per_image = 16;
  auto ds = data::make_image_dataset(o);
  const data::Batch b = ds->get(all_indices(*ds));
  const at::Tensor diff = b.inputs - b.targets;
  EXPECT_NEAR(diff.mean().item<double>(), 0.0, 0.005);
  EXPECT_NEAR(diff.std().item<double>(), 0.1, 0.005);
  EXPECT_GE(b.inputs.min().item<float>(), 0.0f);
  EXPECT_LE(b.inputs.max().item<float>(), 1.0f);
  // Different samples get different noise.
  EXPECT_FALSE(at::equal(diff[0], diff[1]));
}

TEST(ImageFolder, ScaleTwoInputIsAvgPoolOfTarget) {
  test::TempDir dir;
  write_png(dir.file("a.png"), 90, 70, [](int x, int y) {
    return std::array<uint8_t, 3>{static_cast<uint8_t>(x * 7 + y), static_cast<uint8_t>(x * y),
                                  static_cast<uint8_t>(255 - x)};
  });
  for (int64_t scale : {2, 4}) {
    auto ds = data::make_image_dataset(options(dir.path(), 32, scale, 0.3));  // noise ignored
    EXPECT_EQ(ds->shape().scale, scale);
    const data::Batch b = ds->get(all_indices(*ds));
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{8, 3, 32 / scale, 32 / scale}));
    ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{8, 3, 32, 32}));
    const at::Tensor expected = at::avg_pool2d(b.targets, {scale, scale}, {scale, scale});
    EXPECT_TRUE(at::allclose(b.inputs, expected, 1e-6, 1e-6)) << "scale " << scale;
  }
}

TEST(ImageFolder, GreyImagesBecomeRgb) {
  test::TempDir dir;
  std::vector<uint8_t> grey(40 * 30);
  for (size_t k = 0; k < grey.size(); ++k) grey[k] = static_cast<uint8_t>(k * 3);
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = 40;
  image.height = 30;
  image.format = PNG_FORMAT_GRAY;
  ASSERT_NE(png_image_write_to_file(&image, dir.file("g.png").c_str(), 0, grey.data(), 0, nullptr),
            0);
  auto ds = data::make_image_dataset(options(dir.path(), 16));
  const data::Batch b = ds->get(all_indices(*ds));
  EXPECT_TRUE(at::equal(b.targets.select(1, 0), b.targets.select(1, 1)));
  EXPECT_TRUE(at::equal(b.targets.select(1, 0), b.targets.select(1, 2)));
}

TEST(ImageFolder, ValidationSplitFromValFraction) {
  test::TempDir dir;
  for (const char* name : {"c.png", "a.png", "e.png", "b.png", "d.png"}) {
    write_coordinate_png(dir.file(name), 40, 40);
  }
  write_bytes(dir.file("notes.txt"), "not an image");
  DataOptions o = options(dir.path(), 16);
  o.val_fraction = 0.4;  // 2 of 5 files
  auto ds = data::make_image_dataset(o);
  const auto* images = dynamic_cast<const ImageFolderDataset*>(ds.get());
  ASSERT_NE(images, nullptr);
  EXPECT_EQ(images->files(),
            (std::vector<std::string>{dir.file("a.png"), dir.file("b.png"), dir.file("c.png")}));
  EXPECT_EQ(ds->size(), 3 * 8);
  auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  const auto* val_images = dynamic_cast<const ImageFolderDataset*>(val.get());
  ASSERT_NE(val_images, nullptr);
  EXPECT_EQ(val_images->files(), (std::vector<std::string>{dir.file("d.png"), dir.file("e.png")}));
  EXPECT_EQ(val->size(), 2 * 8);
  EXPECT_EQ(val->validation(), nullptr);
  // Deterministic validation crops, from their own seed stream.
  EXPECT_TRUE(at::equal(val->get(all_indices(*val)).targets, val->get(all_indices(*val)).targets));
  int differs = 0;
  for (int64_t i = 0; i < val->size(); ++i)
    differs += val_images->crop_origin(i) != images->crop_origin(i);
  EXPECT_GT(differs, 0);

  o.val_fraction = 0.01;  // rounds to 0, held out anyway: at least one file
  EXPECT_EQ(data::make_image_dataset(o)->validation()->size(), 8);
  o.val_fraction = 0.0;
  EXPECT_EQ(data::make_image_dataset(o)->validation(), nullptr);
  EXPECT_EQ(data::make_image_dataset(o)->size(), 5 * 8);
}

TEST(ImageFolder, ValidationSplitFromValPath) {
  test::TempDir train_dir, val_dir;
  write_coordinate_png(train_dir.file("a.png"), 40, 40);
  write_coordinate_png(train_dir.file("b.png"), 40, 40);
  write_coordinate_png(val_dir.file("v.png"), 50, 50);
  DataOptions o = options(train_dir.path(), 16);
  o.val_path = val_dir.path();
  o.val_fraction = 0.5;  // ignored: val_path wins
  auto ds = data::make_image_dataset(o);
  EXPECT_EQ(ds->size(), 2 * 8);
  auto val = ds->validation();
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(val->size(), 8);
  const auto* val_images = dynamic_cast<const ImageFolderDataset*>(val.get());
  ASSERT_NE(val_images, nullptr);
  EXPECT_EQ(val_images->files(), (std::vector<std::string>{val_dir.file("v.png")}));

  test::TempDir empty_val;
  o.val_path = empty_val.path();
  const std::string message = error_of([&] { data::make_image_dataset(o); });
  EXPECT_NE(message.find("data.val_path"), std::string::npos) << message;
}

TEST(ImageFolder, ErrorsNameTheFileOrKey) {
  {
    test::TempDir dir;
    write_coordinate_png(dir.file("a.png"), 40, 40);
    std::string junk;
    for (int k = 0; k < 200; ++k) junk.push_back(static_cast<char>((k * 131 + 7) & 0xff));
    write_bytes(dir.file("x.png"), junk);
    const std::string message =
        error_of([&] { data::make_image_dataset(options(dir.path(), 16)); });
    EXPECT_NE(message.find(dir.file("x.png")), std::string::npos) << message;
  }
  {
    test::TempDir dir;
    const std::string message =
        error_of([&] { data::make_image_dataset(options(dir.path(), 16)); });
    EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
    EXPECT_NE(message.find("no .png"), std::string::npos) << message;
  }
  {
    test::TempDir dir;
    const std::string missing = dir.file("missing");
    const std::string message = error_of([&] { data::make_image_dataset(options(missing, 16)); });
    EXPECT_NE(message.find(missing), std::string::npos) << message;
  }
  {
    test::TempDir dir;
    write_coordinate_png(dir.file("a.png"), 64, 64);
    write_coordinate_png(dir.file("small.png"), 64, 20);
    const std::string message =
        error_of([&] { data::make_image_dataset(options(dir.path(), 32)); });
    EXPECT_NE(message.find(dir.file("small.png")), std::string::npos) << message;
    EXPECT_NE(message.find("data.patch_size"), std::string::npos) << message;
  }
  {
    test::TempDir dir;
    write_coordinate_png(dir.file("a.png"), 64, 64);
    std::string message = error_of([&] { data::make_image_dataset(options(dir.path(), 30, 4)); });
    EXPECT_NE(message.find("data.patch_size"), std::string::npos) << message;
    message = error_of([&] { data::make_image_dataset(options(dir.path(), 30, 3)); });
    EXPECT_NE(message.find("data.scale"), std::string::npos) << message;
  }
}

// The CRC-32 of PNG's chunks (ISO 3309, reflected, polynomial 0xEDB88320) over `bytes`.
uint32_t png_crc(const std::string& bytes) {
  uint32_t crc = 0xffffffffu;
  for (const char ch : bytes) {
    crc ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

void put_big_endian_32(std::string& bytes, size_t at, uint32_t value) {
  for (int k = 0; k < 4; ++k) bytes[at + k] = static_cast<char>((value >> (24 - 8 * k)) & 0xff);
}

// libpng allocates what a chunk declares before reading it, and the pixels the header promises
// before decoding them: a 49-byte file that declared a 1.6 GB zTXt chunk took 2 GB (the fuzz
// finding in tests/fuzz/regressions/png_image), and a header of 60000 x 60000 pixels over 40 x 40
// pixels' data would take 10 GB in get(). Both are refused on open, naming the file.
TEST(ImageFolder, ChunksPastTheEndAndSizesTheDataCannotHoldAreRefusedOnOpen) {
  {
    test::TempDir dir;
    write_coordinate_png(dir.file("a.png"), 40, 40);
    // The finding without its first byte (the fuzz target's settings): an 8 x 8 RGB header, then
    // a zTXt chunk of 0x63616368 bytes cut after its type, then an IDAT cut the same way.
    const unsigned char cut[] = {0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00,
                                 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00, 0x08,
                                 0x00, 0x00, 0x00, 0x08, 0x08, 0x02, 0x00, 0x00, 0x00, 0x4b,
                                 0x6d, 0x29, 0xdc, 0x63, 0x61, 0x63, 0x68, 0x7a, 0x54, 0x58,
                                 0x74, 0x00, 0x00, 0x00, 0xd3, 0x49, 0x44, 0x41, 0x54};
    write_bytes(dir.file("cut.png"), std::string(reinterpret_cast<const char*>(cut), sizeof cut));
    const std::string message = error_of([&] { data::make_image_dataset(options(dir.path(), 4)); });
    EXPECT_NE(message.find(dir.file("cut.png")), std::string::npos) << message;
    EXPECT_NE(message.find("chunk 'zTXt' at byte 33 declares 1667326824 bytes"), std::string::npos)
        << message;
  }
  {
    test::TempDir dir;
    write_coordinate_png(dir.file("a.png"), 40, 40);
    std::ifstream in(dir.file("a.png"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(bytes.substr(12, 4), "IHDR");
    put_big_endian_32(bytes, 16, 60000);  // width and height, then IHDR's CRC over type and data
    put_big_endian_32(bytes, 20, 60000);
    put_big_endian_32(bytes, 29, png_crc(bytes.substr(12, 17)));
    write_bytes(dir.file("huge.png"), bytes);
    const std::string message =
        error_of([&] { data::make_image_dataset(options(dir.path(), 16)); });
    EXPECT_NE(message.find(dir.file("huge.png")), std::string::npos) << message;
    EXPECT_NE(message.find("60000x60000 pixels"), std::string::npos) << message;
  }
}

TEST(ImageFolder, FileBrokenAfterOpenIsADataErrorInGet) {
  test::TempDir dir;
  write_coordinate_png(dir.file("a.png"), 40, 40);
  write_coordinate_png(dir.file("b.png"), 40, 40);
  auto ds = data::make_image_dataset(options(dir.path(), 16));
  write_bytes(dir.file("b.png"), "\x89PNG\r\n\x1a\n truncated");
  EXPECT_NO_THROW(ds->get(at::tensor(std::vector<int64_t>{0}, at::kLong)));
  const std::string message =
      error_of([&] { ds->get(at::tensor(std::vector<int64_t>{9}, at::kLong)); });
  EXPECT_NE(message.find(dir.file("b.png")), std::string::npos) << message;
}

}  // namespace TRAINER_UNITY_ID
