#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/temp_dir.h"
#include "fuzz_target.h"

namespace fuzz {
namespace fs = std::filesystem;

const std::string& scratch_dir() {
  static const test::TempDir scratch;  // removed at exit (not by std::filesystem: temp_dir.h)
  return scratch.path();
}

std::string write_file(const std::string& name, std::string_view bytes) {
  const fs::path file = fs::path(scratch_dir()) / name;
  fs::create_directories(file.parent_path());
  const std::string path = file.string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::logic_error("fuzz: cannot write " + path);
  return path;
}

void remove_file(const std::string& name) {
  std::error_code ec;
  fs::remove(fs::path(scratch_dir()) / name, ec);
}

std::vector<std::string_view> split_parts(std::string_view input, size_t parts) {
  std::vector<std::string_view> out;
  while (!input.empty() || out.empty()) {
    const size_t at = out.size() + 1 < parts ? input.find(kSeparator) : std::string_view::npos;
    out.push_back(input.substr(0, at));
    if (at == std::string_view::npos) break;
    input.remove_prefix(at + kSeparator.size());
  }
  return out;
}

}  // namespace fuzz
