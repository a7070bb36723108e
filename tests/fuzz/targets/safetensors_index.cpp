// A Hugging Face model.safetensors.index.json through read_safetensors_dir (model.init_from of a
// sharded save_pretrained directory), beside two valid shards named as save_pretrained names
// them. Typed error: io::SafetensorsError.
#include <ATen/ATen.h>

#include "fuzz_target.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"

namespace {

void write_shards() {
  static const bool done = [] {
    io::write_safetensors(fuzz::write_file("index/model-00001-of-00002.safetensors", ""),
                          {{"a", at::arange(6, at::kFloat).reshape({2, 3})}});
    io::write_safetensors(fuzz::write_file("index/model-00002-of-00002.safetensors", ""),
                          {{"b", at::ones({4}, at::kBFloat16)}, {"c", at::zeros({0}, at::kLong)}});
    return true;
  }();
  (void)done;
}

}  // namespace

TRAINER_FUZZ_TARGET(safetensors_index) {
  write_shards();
  const std::string index =
      fuzz::write_file("index/model.safetensors.index.json", fuzz::as_text(data, size));
  const std::string dir = index.substr(0, index.rfind('/'));
  try {
    io::safetensors_files(dir);
    io::read_safetensors_dir(dir);
  } catch (const io::SafetensorsError&) {
  }
  return 0;
}
