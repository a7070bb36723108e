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

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace io {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // A failed system call (writing: open, write, close) with its errno, so that a caller can tell
  // a full disk (ENOSPC, EDQUOT) from other failures.
  SafetensorsError(const std::string& what, int error_number)
      : std::runtime_error(what), error_number_(error_number) {}
  int error_number() const { return error_number_; }  // 0: not a system call's failure

 private:
  int error_number_ = 0;
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

// One tensor of a file as its header lists it: name, dtype and shape.
struct TensorEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t bytes() const;
};

// A safetensors file written one tensor at a time (an export or a consolidation that streams
// the model unit by unit): the header, every entry in name order, is written first; write() then
// takes the tensors in that order, so that the writer holds one tensor at a time. Metadata
// values may be replaced at close() by values of the same length (a checksum known only after
// the data: reserve "crc32:00000000"). Writes to `path` itself: the caller renames a temporary
// name where a half-written file must never be seen. Every error is a SafetensorsError naming
// the file.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorEntry> entries,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter() noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The entries in the order write() takes them (by name).
  const std::vector<TensorEntry>& entries() const { return entries_; }
  // The next entry's tensor: its dtype and shape (any device and layout; copied to contiguous
  // CPU memory here).
  void write(const at::Tensor& tensor);
  // After the last tensor: `patches` replace metadata values given at construction (same length)
  // and the file is flushed and closed.
  void close(const std::map<std::string, std::string>& patches = {});

 private:
  std::string path_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string header_;  // as written, to place the patches
  size_t next_ = 0;
  int fd_ = -1;
  int64_t offset_ = 0;  // bytes written so far
};

// One file opened for ranged reads (sharded checkpoints: each rank reads only the elements it
// keeps). The constructor reads and checks the header (the same checks, and messages, as
// read_safetensors); read() then preads only the bytes of the elements asked for. Holds the file
// open; not copyable; not thread-safe. Every error is a SafetensorsError naming the file and,
// where it applies, the tensor.
class SafetensorsRangeReader {
 public:
  struct TensorInfo {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    uint64_t begin = 0;  // byte offset of its data in the file
  };

  explicit SafetensorsRangeReader(const std::string& path);
  ~SafetensorsRangeReader() noexcept;
  SafetensorsRangeReader(const SafetensorsRangeReader&) = delete;
  SafetensorsRangeReader& operator=(const SafetensorsRangeReader&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& key) const { return tensors_.count(key) != 0; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // Throws SafetensorsError when the file has no tensor `key`.
  const TensorInfo& info(const std::string& key) const;
  // Elements [offset, offset + count) of `key`, seen flat (row-major), into `out`: a contiguous
  // CPU tensor of the tensor's dtype and `count` elements. Throws SafetensorsError for an unknown
  // key, a range outside the tensor, another dtype or a short read.
  void read(const std::string& key, int64_t offset, int64_t count, const at::Tensor& out);
  // Tensor bytes this reader has read so far.
  int64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::map<std::string, TensorInfo> tensors_;
  int64_t bytes_read_ = 0;
};

// Tensor bytes read by this process so far, by read_safetensors and every SafetensorsRangeReader
// (a test hook: what a rank read to resume).
int64_t safetensors_bytes_read();

}  // namespace io
