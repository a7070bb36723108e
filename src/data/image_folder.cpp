#include "data/image_folder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <dirent.h>
#include <sys/stat.h>

#include "core/splitmix.h"
#include "data/errors.h"
#include "data/mapped_file.h"
#include "data/readers.h"

namespace data {

using core::splitmix64;

namespace {

uint64_t sample_hash(uint64_t stream, int64_t i) {
  return splitmix64(stream ^ splitmix64(static_cast<uint64_t>(i)));
}

bool ends_with_png(const std::string& name) {
  if (name.size() <= 4) return false;
  std::string ext = name.substr(name.size() - 4);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".png";
}

// The .png files of `dir` (full paths), sorted by name. `key` names the config key in errors.
std::vector<std::string> png_files(const std::string& key, const std::string& dir) {
  if (dir.empty()) throw DataError(fmt::format("{}: empty; give a directory of .png files", key));
  if (!is_directory(dir)) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {  // missing, or a symlink loop: say which
      throw DataError(
          fmt::format("{}: {}: {} (a directory of .png files)", key, dir, std::strerror(errno)));
    }
    throw DataError(fmt::format("{}: {} is not a directory (of .png files)", key, dir));
  }
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw DataError(
        fmt::format("{}: cannot open the directory {}: {}", key, dir, std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (ends_with_png(name)) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) throw DataError(fmt::format("{}: {} holds no .png files", key, dir));
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const auto& n : names) out.push_back(dir + "/" + n);
  return out;
}

uint32_t big_endian_32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Walks the chunk headers of the PNG file `path` (8 bytes each, a seek past each chunk's data)
// before libpng reads it: libpng allocates a chunk's declared length before it reads the chunk,
// so a truncated file that declares a 1.6 GB zTXt chunk cost 2 GB of memory (a fuzz finding,
// tests/fuzz/regressions/png_image). Returns the bytes of image data (IDAT) the file holds. A
// file without PNG's signature is left to libpng's message.
int64_t checked_idat_bytes(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw DataError(fmt::format("{}: cannot open the PNG: {}", path, std::strerror(errno)));
  const auto size = static_cast<int64_t>(in.tellg());
  unsigned char head[8];
  in.seekg(0);
  if (size < 8 || !in.read(reinterpret_cast<char*>(head), 8) ||
      std::memcmp(head, kSignature, 8) != 0) {
    return 0;
  }
  int64_t idat = 0;
  for (int64_t at = 8; at + 8 <= size;) {
    in.seekg(at);
    if (!in.read(reinterpret_cast<char*>(head), 8)) {
      throw DataError(fmt::format("{}: cannot read the PNG at byte {}", path, at));
    }
    const int64_t length = big_endian_32(head);
    std::string type(reinterpret_cast<const char*>(head + 4), 4);
    for (char& c : type) c = std::isalpha(static_cast<unsigned char>(c)) != 0 ? c : '?';
    if (length > 0x7fffffff || at + 12 + length > size) {
      throw DataError(fmt::format(
          "{}: cannot read the PNG: its chunk '{}' at byte {} declares {} bytes, past the end of "
          "the file ({} bytes): the file is truncated or corrupt",
          path, type, at, length, size));
    }
    if (type == "IDAT") idat += length;
    if (type == "IEND") break;
    at += 12 + length;
  }
  return idat;
}

// A PNG read through libpng's simplified API, the chunks checked first (checked_idat_bytes) and
// the header's size against what the image data can hold: deflate expands at most 1,032-fold,
// and a pixel of 1 bit becomes 3 bytes of RGB (24-fold), so a header that promises more than
// 24 x 1,032 x its IDAT bytes (and 1 MiB) is refused before the pixels are allocated. Throws
// DataError naming the file.
class PngRead {
 public:
  explicit PngRead(const std::string& path) {
    const int64_t idat = checked_idat_bytes(path);
    std::memset(&image_, 0, sizeof image_);
    image_.version = PNG_IMAGE_VERSION;
    if (png_image_begin_read_from_file(&image_, path.c_str()) == 0) {
      const std::string message = image_.message;
      png_image_free(&image_);
      throw DataError(fmt::format("{}: cannot read the PNG: {}", path, message));
    }
    const auto decoded = int64_t{image_.width} * int64_t{image_.height} * 3;
    if (decoded > std::max<int64_t>(int64_t{24} * 1032 * idat, int64_t{1} << 20)) {
      png_image_free(&image_);
      throw DataError(fmt::format(
          "{}: cannot read the PNG: its header says {}x{} pixels, more than its {} bytes of "
          "image data can hold: the file is truncated or corrupt",
          path, image_.width, image_.height, idat));
    }
  }
  ~PngRead() { png_image_free(&image_); }
  PngRead(const PngRead&) = delete;
  PngRead& operator=(const PngRead&) = delete;
  png_image& image() { return image_; }

 private:
  png_image image_;
};

void check_params(const ImageFolderDataset::Params& p) {
  if (p.scale != 1 && p.scale != 2 && p.scale != 4) {
    throw DataError(fmt::format("data.scale must be 1, 2 or 4, got {}", p.scale));
  }
  if (p.patch_size < 1)
    throw DataError(fmt::format("data.patch_size must be positive, got {}", p.patch_size));
  if (p.patch_size % p.scale != 0) {
    throw DataError(fmt::format("data.patch_size = {} is not a multiple of data.scale = {}",
                                p.patch_size, p.scale));
  }
  if (p.crops_per_image < 1) {
    throw DataError(
        fmt::format("data.crops_per_image must be positive, got {}", p.crops_per_image));
  }
  if (p.noise_std < 0.0)
    throw DataError(fmt::format("data.noise_std must be >= 0, got {}", p.noise_std));
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(std::vector<std::string> files, Params params,
                                       std::vector<std::string> validation_files)
    : files_(std::move(files)), params_(params) {
  check_params(params_);
  if (files_.empty()) throw DataError("data.path: no .png files");
  for (const auto& f : files_) {
    PngRead png(f);
    Image im{f, static_cast<int64_t>(png.image().width), static_cast<int64_t>(png.image().height)};
    if (im.width < params_.patch_size || im.height < params_.patch_size) {
      throw DataError(
          fmt::format("{}: the image is {}x{} pixels, smaller than data.patch_size = {}", f,
                      im.width, im.height, params_.patch_size));
    }
    images_.push_back(std::move(im));
  }
  if (!validation_files.empty()) {
    Params v = params_;
    v.seed = params_.seed ^ kImageValidationSeed;
    validation_ = std::make_shared<ImageFolderDataset>(std::move(validation_files), v);
  }
}

int64_t ImageFolderDataset::size() const {
  return static_cast<int64_t>(images_.size()) * params_.crops_per_image;
}

core::Shape ImageFolderDataset::shape() const {
  core::Shape s;
  s.channels = 3;
  s.scale = params_.scale;
  return s;
}

std::pair<int64_t, int64_t> ImageFolderDataset::crop_origin(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range(fmt::format("image sample {} is outside [0, {})", i, size()));
  }
  const Image& im = images_[static_cast<size_t>(i / params_.crops_per_image)];
  const uint64_t h = sample_hash(params_.seed, i);
  const auto span_x = static_cast<uint64_t>(im.width - params_.patch_size + 1);
  const auto span_y = static_cast<uint64_t>(im.height - params_.patch_size + 1);
  return {static_cast<int64_t>(h % span_x), static_cast<int64_t>(splitmix64(h) % span_y)};
}

Batch ImageFolderDataset::get(const at::Tensor& indices) const {
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t n = idx.numel();
  const int64_t* ids = idx.data_ptr<int64_t>();
  const int64_t p = params_.patch_size;
  const int64_t q = p / params_.scale;
  at::Tensor targets = at::empty({n, 3, p, p}, at::kFloat);
  at::Tensor inputs = at::empty({n, 3, q, q}, at::kFloat);
  std::vector<uint8_t> pixels;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = ids[k];
    const auto [x0, y0] = crop_origin(i);
    const Image& im = images_[static_cast<size_t>(i / params_.crops_per_image)];

    PngRead png(im.path);
    png_image& image = png.image();
    if (static_cast<int64_t>(image.width) != im.width ||
        static_cast<int64_t>(image.height) != im.height) {
      throw DataError(fmt::format("{}: the image changed since it was opened ({}x{}, now {}x{})",
                                  im.path, im.width, im.height, image.width, image.height));
    }
    image.format = PNG_FORMAT_RGB;
    pixels.resize(PNG_IMAGE_SIZE(image));
    if (png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) == 0) {
      throw DataError(fmt::format("{}: cannot decode the PNG: {}", im.path, image.message));
    }

    // The crop, HWC uint8 -> CHW float in [0, 1].
    at::Tensor whole = at::from_blob(pixels.data(), {im.height, im.width, 3}, at::kByte);
    at::Tensor target =
        whole.narrow(0, y0, p).narrow(1, x0, p).permute({2, 0, 1}).to(at::kFloat).div_(255.0f);
    targets[k].copy_(target);

    if (params_.scale == 1) {
      at::Tensor input = target;
      if (params_.noise_std > 0.0) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(sample_hash(params_.seed, i));
        at::Tensor noise =
            at::normal(0.0, params_.noise_std, {3, p, p}, gen, at::TensorOptions(at::kFloat));
        input = (target + noise).clamp_(0.0, 1.0);
      }
      inputs[k].copy_(input);
    } else {
      inputs[k].copy_(at::avg_pool2d(target.unsqueeze(0), {params_.scale, params_.scale},
                                     {params_.scale, params_.scale})
                          .squeeze(0));
    }
  }
  return {inputs, targets};
}

std::unique_ptr<Dataset> make_image_dataset(const DataOptions& o) {
  ImageFolderDataset::Params params;
  params.patch_size = o.patch_size;
  params.scale = o.scale;
  params.noise_std = o.noise_std;
  params.crops_per_image = o.crops_per_image;
  params.seed = o.seed;
  check_params(params);  // before reading any file: a key error names the key

  std::vector<std::string> train = png_files("data.path", o.path);
  std::vector<std::string> validation;
  if (!o.val_path.empty()) {
    validation = png_files("data.val_path", o.val_path);
  } else if (o.val_fraction > 0.0 && train.size() >= 2) {
    auto held =
        static_cast<size_t>(std::llround(o.val_fraction * static_cast<double>(train.size())));
    held = std::clamp<size_t>(held, 1, train.size() - 1);
    validation.assign(train.end() - static_cast<std::ptrdiff_t>(held), train.end());
    train.resize(train.size() - held);
  }
  return std::make_unique<ImageFolderDataset>(std::move(train), params, std::move(validation));
}

}  // namespace data
