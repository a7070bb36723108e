// A PNG image through make_image_dataset (data.name: images): the folder's files checked on open
// (libpng's header and size), then samples decoded and cropped (get). The first byte picks the
// settings (data.patch_size 1 to 16, data.scale 1, 2 or 4 where it divides the patch, noise or
// none). Typed error: data::DataError.
#include <ATen/ATen.h>

#include "data/errors.h"
#include "data/readers.h"
#include "fuzz_target.h"

TRAINER_FUZZ_TARGET(png_image) {
  if (size == 0) return 0;
  data::DataOptions options;
  const std::string file =
      fuzz::write_file("png_image/image.png", fuzz::as_text(data + 1, size - 1));
  options.path = file.substr(0, file.rfind('/'));
  const int64_t scales[] = {1, 2, 4, 1};
  options.scale = scales[data[0] & 3];
  options.patch_size = options.scale * (1 + ((data[0] >> 2) & 3));
  options.noise_std = (data[0] & 16) != 0 ? 0.1 : 0.0;
  options.crops_per_image = 2;
  options.seed = data[0];
  try {
    const auto dataset = data::make_image_dataset(options);
    dataset->get(at::arange(dataset->size(), at::kLong));
  } catch (const data::DataError&) {
  }
  return 0;
}
