#include "io/output_dir.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace io {

void create_output_dir(const std::string& key, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec)) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  if (ec) {
    throw std::invalid_argument(
        fmt::format("{} = '{}': cannot create it: {}", key, dir, ec.message()));
  }
}

void check_output_dir(const std::string& key, const std::string& dir) {
  create_output_dir(key, dir);
  const std::string probe = fmt::format("{}/.trainer-write-test-{}", dir, ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  const int err = errno;
  if (f == nullptr) {
    throw std::invalid_argument(
        fmt::format("{} = '{}': cannot write there: {}", key, dir, std::strerror(err)));
  }
  std::fclose(f);
  std::remove(probe.c_str());
}

}  // namespace io
