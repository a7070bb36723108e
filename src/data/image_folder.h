// ImageFolderDataset: random crops of a folder of PNG images, degraded on the fly (denoising or
// super-resolution pairs).
//
// Files: data.path's *.png, sorted by name, decoded with libpng's simplified API as 8-bit RGB
// (grey and alpha images become RGB through PNG_FORMAT_RGB; alpha is composited away). Validated
// on open (every file's header is read): a missing or empty directory (no .png in it), a corrupt
// or unreadable PNG (libpng's message included), an image smaller than data.patch_size on either
// side, data.scale not 1, 2 or 4, and data.patch_size not a multiple of data.scale are DataErrors
// naming the file (or the key).
//
// Validation split: data.val_path's PNGs when it is set; otherwise the last
// round(val_fraction * files) files of data.path (at least 1 when there are 2+ files and
// val_fraction > 0; never all of them) are held out. validation() is nullptr when none are.
//
// Samples: size() = files * crops_per_image; sample i reads image i / crops_per_image, decoded in
// get() (nothing is cached). With h = splitmix64(stream ^ splitmix64(i)), where stream is data.seed
// for training and data.seed ^ 0x5eed for the validation split (so validation crops are fixed and
// differ from training's), the crop is at x = h % (width - p + 1),
// y = splitmix64(h) % (height - p + 1). The target is that clean crop, float [3, p, p] in [0, 1]
// (pixel / 255). The input: scale 1, the target plus Gaussian noise of std noise_std drawn from a
// CPU generator seeded with h, clamped to [0, 1]; scale 2 or 4, avg_pool2d(target, scale) (area
// downscale), no noise. So an index gives the same sample on any thread, rank or run.
// A file that fails to decode in get() (changed after open) is a DataError naming it.
// Immutable after construction; get() may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace data {

class ImageFolderDataset final : public Dataset {
 public:
  struct Params {
    int64_t patch_size = 0;
    int64_t scale = 1;
    double noise_std = 0.0;
    int64_t crops_per_image = 1;
    uint64_t seed = 0;  // the crop/noise stream (already mixed for a validation split)
  };

  // `files`: the training images in order; `validation_files`: the held-out split (may be empty).
  ImageFolderDataset(std::vector<std::string> files, Params params,
                     std::vector<std::string> validation_files = {});

  int64_t size() const override;
  core::Shape shape() const override;
  Batch get(const at::Tensor& indices) const override;
  std::shared_ptr<const Dataset> validation() const override { return validation_; }

  const std::vector<std::string>& files() const { return files_; }
  // The crop origin (x, y) of sample i (the rule above).
  std::pair<int64_t, int64_t> crop_origin(int64_t i) const;

 private:
  struct Image {
    std::string path;
    int64_t width = 0;
    int64_t height = 0;
  };
  std::vector<std::string> files_;
  std::vector<Image> images_;
  Params params_;
  std::shared_ptr<const Dataset> validation_;
};

// The seed stream of the validation split: data.seed ^ kImageValidationSeed.
constexpr uint64_t kImageValidationSeed = 0x5eed;

}  // namespace data
