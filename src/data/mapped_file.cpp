#include "data/mapped_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/errors.h"

namespace data {

MappedFile::MappedFile(const std::string& path, const char* what) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; this way
  // it opens at once and is refused below. A regular file's mapping ignores the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw DataError(fmt::format("{}: cannot open the {}: {}", path, what, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("{}: not a regular file", path));
  }
  bytes_ = static_cast<int64_t>(st.st_size);
  if (bytes_ > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: cannot map the {}: {}", path, what, std::strerror(err)));
    }
    data_ = static_cast<const unsigned char*>(map);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(bytes_));
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string folder_of(const std::string& path) {
  if (is_directory(path)) return path;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace data
