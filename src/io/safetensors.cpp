#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

// Tensor bytes are copied as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace io {
namespace {

using nlohmann::json;

std::atomic<int64_t> g_bytes_read{0};  // safetensors_bytes_read()

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
};

constexpr std::array<DtypeInfo, 10> kDtypes{{
    {"F64", at::kDouble},
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
}};

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return names;
}

template <class... Args>
SafetensorsError error(const std::string& path, fmt::format_string<Args...> what, Args&&... args) {
  return SafetensorsError(
      fmt::format("{}: {}", path, fmt::format(what, std::forward<Args>(args)...)));
}

// A failed system call's error: the message ends with strerror(`err`), and the error keeps `err`.
template <class... Args>
SafetensorsError system_error(const std::string& path, int err, fmt::format_string<Args...> what,
                              Args&&... args) {
  return SafetensorsError(
      fmt::format("{}: {}: {}", path, fmt::format(what, std::forward<Args>(args)...),
                  std::strerror(err)),
      err);
}

// A JSON value that must be a non-negative integer (shapes and offsets).
bool as_size(const json& v, uint64_t& out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  const int64_t s = v.get<int64_t>();
  if (s < 0) return false;
  out = static_cast<uint64_t>(s);
  return true;
}

void write_all(int fd, const std::string& path, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw system_error(path, errno, "writing the file failed");
    if (n == 0) throw system_error(path, ENOSPC, "writing the file failed");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// One header entry, checked against the data section (`data_bytes` long).
struct Entry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& e,
                  uint64_t data_bytes) {
  const auto bad = [&](const std::string& what) {
    return error(path, "tensor '{}': {}", name, what);
  };
  if (!e.is_object()) throw bad("header entry is not a JSON object");
  if (!e.contains("dtype") || !e["dtype"].is_string()) throw bad("missing string 'dtype'");
  const std::string dtype = e["dtype"].get<std::string>();
  const auto type = dtype_from_name(dtype);
  if (!type) {
    throw bad(
        fmt::format("unknown dtype '{}' (supported: {})", dtype, fmt::join(dtype_names(), ", ")));
  }

  if (!e.contains("shape") || !e["shape"].is_array()) throw bad("missing array 'shape'");
  Entry out{*type, {}, 0, 0};
  uint64_t numel = 1;
  for (const auto& d : e["shape"]) {
    uint64_t n = 0;
    if (!as_size(d, n) || n > uint64_t(INT64_MAX)) {
      throw bad(fmt::format("shape {} holds a value that is not a non-negative integer",
                            e["shape"].dump()));
    }
    if (n != 0 && numel > UINT64_MAX / n)
      throw bad(fmt::format("shape {} is too large", e["shape"].dump()));
    numel *= n;
    out.shape.push_back(static_cast<int64_t>(n));
  }
  const uint64_t elem = c10::elementSize(*type);
  if (numel > UINT64_MAX / elem) throw bad(fmt::format("shape {} is too large", e["shape"].dump()));

  const json& off = e.contains("data_offsets") ? e["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !as_size(off[0], out.begin) ||
      !as_size(off[1], out.end)) {
    throw bad("'data_offsets' must be [begin, end] with non-negative integers");
  }
  if (out.begin > out.end || out.end > data_bytes) {
    throw bad(fmt::format("data_offsets [{}, {}] are out of range: the data section holds {} bytes",
                          out.begin, out.end, data_bytes));
  }
  if (out.end - out.begin != numel * elem) {
    throw bad(fmt::format("data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}",
                          out.begin, out.end, out.end - out.begin, e["shape"].dump(), dtype,
                          numel * elem));
  }
  return out;
}

// Opens `path` and parses its header; `in` is left open for the data.
json read_header(const std::string& path, std::ifstream& in, uint64_t* file_bytes_out,
                 uint64_t* header_bytes_out) {
  in.open(path, std::ios::binary | std::ios::ate);
  if (!in) throw error(path, "cannot open the file: {}", std::strerror(errno));
  const std::streamoff end = in.tellg();
  if (end < 0) throw error(path, "cannot read the file size");
  const auto file_bytes = static_cast<uint64_t>(end);
  in.seekg(0);

  if (file_bytes < 8) {
    throw error(path, "truncated: {} bytes, fewer than the 8-byte header length", file_bytes);
  }
  std::array<unsigned char, 8> len_bytes{};
  in.read(reinterpret_cast<char*>(len_bytes.data()), 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];
  if (header_bytes > file_bytes - 8) {
    throw error(path, "truncated: the header length says {} bytes but only {} follow", header_bytes,
                file_bytes - 8);
  }
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) throw error(path, "cannot read the {}-byte header", header_bytes);

  json j;
  try {
    j = json::parse(header);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e400)
    throw error(path, "the header is not valid JSON: {}", e.what());
  }
  if (!j.is_object()) throw error(path, "the header is not a JSON object");

  *file_bytes_out = file_bytes;
  *header_bytes_out = header_bytes;
  return j;
}

std::map<std::string, std::string> metadata_of(const std::string& path, const json& j) {
  std::map<std::string, std::string> out;
  const auto it = j.find("__metadata__");
  if (it == j.end()) return out;
  if (!it->is_object()) throw error(path, "'__metadata__' is not a JSON object");
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) throw error(path, "metadata '{}' is not a string", key);
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

}  // namespace

std::optional<at::ScalarType> dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

std::optional<std::string> dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return std::string(d.name);
  }
  return std::nullopt;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::ifstream in;
  uint64_t file_bytes = 0, header_bytes = 0;
  return metadata_of(path, read_header(path, in, &file_bytes, &header_bytes));
}

std::map<std::string, at::Tensor> read_safetensors(const std::string& path,
                                                   std::map<std::string, std::string>* metadata) {
  std::ifstream in;
  uint64_t file_bytes = 0, header_bytes = 0;
  const json j = read_header(path, in, &file_bytes, &header_bytes);
  if (metadata != nullptr) *metadata = metadata_of(path, j);
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") continue;
    const Entry e = parse_entry(path, name, value, data_bytes);
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    const auto bytes = static_cast<std::streamsize>(e.end - e.begin);
    if (bytes > 0) {
      in.seekg(static_cast<std::streamoff>(data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), bytes);
      if (!in || in.gcount() != bytes) {
        throw error(path, "tensor '{}': cannot read its {} bytes", name, bytes);
      }
      g_bytes_read += bytes;
    }
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

int64_t safetensors_bytes_read() { return g_bytes_read.load(); }

SafetensorsRangeReader::SafetensorsRangeReader(const std::string& path) : path_(path) {
  uint64_t file_bytes = 0, header_bytes = 0;
  json j;
  {
    std::ifstream in;
    j = read_header(path, in, &file_bytes, &header_bytes);
  }
  const uint64_t data_start = 8 + header_bytes;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") continue;
    const Entry e = parse_entry(path, name, value, file_bytes - data_start);
    const auto elem = static_cast<uint64_t>(c10::elementSize(e.dtype));
    tensors_.emplace(name,
                     TensorInfo{e.dtype, e.shape, static_cast<int64_t>((e.end - e.begin) / elem),
                                data_start + e.begin});
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw error(path, "cannot open the file: {}", std::strerror(errno));
}

SafetensorsRangeReader::~SafetensorsRangeReader() noexcept {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsRangeReader::TensorInfo& SafetensorsRangeReader::info(
    const std::string& key) const {
  const auto it = tensors_.find(key);
  if (it == tensors_.end()) throw error(path_, "has no tensor '{}'", key);
  return it->second;
}

void SafetensorsRangeReader::read(const std::string& key, int64_t offset, int64_t count,
                                  const at::Tensor& out) {
  const TensorInfo& t = info(key);
  if (offset < 0 || count < 0 || offset > t.numel || count > t.numel - offset) {
    throw error(path_, "tensor '{}': elements [{}, {}) are outside its {} elements", key, offset,
                offset + count, t.numel);
  }
  if (out.device().type() != at::kCPU || !out.is_contiguous() || out.scalar_type() != t.dtype ||
      out.numel() != count) {
    throw error(path_,
                "tensor '{}' is {}: its elements cannot be read into a {} tensor of {} elements "
                "(a contiguous CPU tensor of its dtype and {} elements)",
                key, c10::toString(t.dtype), c10::toString(out.scalar_type()), out.numel(), count);
  }
  const auto elem = static_cast<int64_t>(c10::elementSize(t.dtype));
  auto* dst = static_cast<char*>(out.data_ptr());
  int64_t left = count * elem;
  auto pos = static_cast<off_t>(t.begin + offset * elem);
  while (left > 0) {
    const ssize_t got = ::pread(fd_, dst, static_cast<size_t>(left), pos);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw error(path_, "tensor '{}': cannot read elements [{}, {}): {}", key, offset,
                  offset + count, got < 0 ? std::strerror(errno) : "the file ends early");
    }
    dst += got;
    pos += got;
    left -= got;
    bytes_read_ += got;
    g_bytes_read += got;
  }
}

int64_t TensorEntry::bytes() const {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t d : shape) n *= d;
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), entries_(std::move(entries)), metadata_(metadata) {
  std::sort(entries_.begin(), entries_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorEntry& e : entries_) {
    if (e.name == "__metadata__") throw error(path, "'__metadata__' is not a valid tensor name");
    if (header.contains(e.name)) throw error(path, "tensor '{}' is listed twice", e.name);
    const auto dtype = dtype_name(e.dtype);
    if (!dtype) {
      throw error(path, "tensor '{}': dtype {} cannot be written (supported: {})", e.name,
                  c10::toString(e.dtype), fmt::join(dtype_names(), ", "));
    }
    const auto bytes = static_cast<uint64_t>(e.bytes());
    header[e.name] = {
        {"dtype", *dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header_ = header.dump();
  header_.append((8 - header_.size() % 8) % 8, ' ');
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw system_error(path, errno, "cannot open the file for writing");
  std::array<char, 8> len_bytes{};
  uint64_t n = header_.size();
  for (auto& b : len_bytes) {
    b = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  std::string head(len_bytes.data(), 8);
  head += header_;
  write_all(fd_, path_, head.data(), head.size());
}

SafetensorsWriter::~SafetensorsWriter() noexcept {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const at::Tensor& tensor) {
  if (next_ >= entries_.size()) throw error(path_, "more tensors written than listed");
  const TensorEntry& e = entries_[next_];
  if (tensor.scalar_type() != e.dtype || tensor.sizes() != at::IntArrayRef(e.shape)) {
    throw error(path_, "tensor '{}' is listed as {} {}, and written as {} {}", e.name,
                c10::toString(e.dtype), e.shape, c10::toString(tensor.scalar_type()),
                tensor.sizes());
  }
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  write_all(fd_, path_, t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  ++next_;
}

void SafetensorsWriter::close(const std::map<std::string, std::string>& patches) {
  if (next_ != entries_.size()) {
    throw error(path_, "{} of its {} tensors written", next_, entries_.size());
  }
  for (const auto& [key, value] : patches) {
    const auto it = metadata_.find(key);
    const std::string quoted = json(it == metadata_.end() ? "" : it->second).dump();
    const size_t at = header_.find(json(key).dump() + ":" + quoted);
    if (it == metadata_.end() || value.size() != it->second.size() || at == std::string::npos) {
      throw std::logic_error("SafetensorsWriter: a patch needs a metadata value of its length");
    }
    const size_t pos = 8 + at + json(key).dump().size() + 2;  // past `"key":"`
    if (::pwrite(fd_, value.data(), value.size(), static_cast<off_t>(pos)) !=
        static_cast<ssize_t>(value.size())) {
      throw system_error(path_, errno, "cannot write its metadata");
    }
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw system_error(path_, errno, "writing the file failed");
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  SafetensorsWriter writer(path, std::move(entries), metadata);
  for (const auto& [name, tensor] : tensors) writer.write(tensor);  // name order, as listed
  writer.close();
}

}  // namespace io
