// Safetensors: read and write the safetensors file format
// (https://github.com/huggingface/safetensors).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the raw little-endian tensor bytes; offsets are relative to the end of the header.
//
// Contract: `read_safetensors` returns CPU tensors that own their memory (the file is not kept
// open or mapped), keyed by name. Every problem a user can cause (missing or truncated file, bad
// JSON, an unknown dtype, offsets outside the data, a size that disagrees with the shape) is a
// SafetensorsError whose message names the file and, where it applies, the tensor.
// Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace io {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The safetensors name of a dtype ("F32", "BF16", ...) and back; nullopt: not supported.
std::optional<at::ScalarType> dtype_from_name(const std::string& name);
std::optional<std::string> dtype_name(at::ScalarType type);

// Reads every tensor of the file at `path`, and its string metadata when `metadata` is given.
// Throws SafetensorsError.
std::map<std::string, at::Tensor> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Reads only the header's string metadata (cheap: no tensor data). Throws SafetensorsError.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// Writes `tensors` (any device and layout; copied to contiguous CPU memory) to `path`, with
// optional string `metadata`. The header is padded with spaces to a multiple of 8 bytes, as the
// reference implementation does, so readers that map the file see aligned data.
// Throws SafetensorsError for an unsupported dtype or a file that cannot be written.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace io
