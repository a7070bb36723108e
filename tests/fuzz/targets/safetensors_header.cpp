// A safetensors file (the 8-byte header length, the JSON header, the data) through the readers
// the trainer uses: read_safetensors (model.init_from, checkpoints), read_safetensors_metadata and
// SafetensorsRangeReader (sharded checkpoints), reading every tensor's elements. Typed error:
// io::SafetensorsError.
#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>

#include "fuzz_target.h"
#include "io/safetensors.h"

TRAINER_FUZZ_TARGET(safetensors_header) {
  const std::string path = fuzz::write_file("header/model.safetensors", fuzz::as_text(data, size));
  try {
    io::read_safetensors_metadata(path);
    std::map<std::string, std::string> metadata;
    const auto tensors = io::read_safetensors(path, &metadata);
    io::SafetensorsRangeReader reader(path);
    for (const auto& [name, info] : reader.tensors()) {
      if (info.numel > (1 << 20)) continue;  // the bytes are there: the file holds them all
      const at::Tensor out = at::empty({info.numel}, at::TensorOptions().dtype(info.dtype));
      reader.read(name, 0, info.numel, out);
      const at::Tensor& whole = tensors.at(name);  // the same bytes from the other reader
      if (out.nbytes() > 0 && std::memcmp(out.data_ptr(), whole.data_ptr(), out.nbytes()) != 0) {
        std::abort();
      }
    }
  } catch (const io::SafetensorsError&) {
  }
  return 0;
}
