// fuzz_replay TARGET FILE_OR_DIR...: runs the fuzz target TARGET (tests/fuzz/targets/) once on
// every file named, and on every file under every directory named (in name order): the `fuzz`
// ctest tier's replay of the seed corpora and the regression inputs, in a build without
// libFuzzer. Exit 0 when every input returned; an exception that escapes a target is reported
// with the input's name (exit 1); a crash ends the process as it would under libFuzzer.
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace fuzz {
namespace {

std::map<std::string, TargetFunction>& targets() {
  static std::map<std::string, TargetFunction> table;
  return table;
}

std::vector<std::string> inputs_of(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    if (!fs::is_directory(path)) {
      files.push_back(path);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) found.push_back(entry.path().string());
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

bool register_target(const char* name, TargetFunction function) {
  targets().emplace(name, function);
  return true;
}

}  // namespace fuzz

int main(int argc, char** argv) {
  const auto& table = fuzz::targets();
  if (argc < 3 || table.count(argv[1]) == 0) {
    fmt::print(stderr, "usage: fuzz_replay TARGET FILE_OR_DIR...\ntargets:");
    for (const auto& [name, function] : table) fmt::print(stderr, " {}", name);
    fmt::print(stderr, "\n");
    return 2;
  }
  const fuzz::TargetFunction target = table.at(argv[1]);
  const std::vector<std::string> files = fuzz::inputs_of({argv + 2, argv + argc});
  for (const std::string& file : files) {
    const std::string bytes = fuzz::read_all(file);
    try {
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}: {}: an exception escaped the target: {}\n", argv[1], file, e.what());
      return 1;
    }
  }
  fmt::print("{}: {} inputs replayed\n", argv[1], files.size());
  return files.empty() ? 1 : 0;
}
