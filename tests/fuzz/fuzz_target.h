// The fuzz targets' shared frame (docs/DESIGN.md, "Tests and benchmarks": the fuzz tier).
//
// Each file of tests/fuzz/targets/ is one target: TRAINER_FUZZ_TARGET(name) { ... } takes the
// input's bytes and feeds them to the reader the trainer uses. Built two ways from the same file:
// - with libFuzzer (-DTRAINER_FUZZ=ON, clang): the body is LLVMFuzzerTestOneInput, one binary
//   per target (fuzz_NAME), our code under AddressSanitizer and UndefinedBehaviorSanitizer;
// - in every other build: the body is registered under its name in one replay binary
//   (fuzz_replay NAME FILE_OR_DIR...), which the `fuzz` ctest tier runs over each target's seed
//   corpus and the regression inputs.
// A target returns normally for every input, catching only the typed error its reader promises
// (the ones the trainer turns into exit 2); anything else that escapes (another exception, an
// abort, a sanitizer report) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

using TargetFunction = int (*)(const uint8_t* data, size_t size);

// The replay binary's table (replay_main.cpp); returns true so a static can hold the call.
bool register_target(const char* name, TargetFunction function);

// A scratch directory of this process's own (created on first use, under $TMPDIR or /tmp,
// removed at exit with the files of each target's directory in it).
const std::string& scratch_dir();

// Writes `bytes` to scratch_dir()/name (replacing it; `name` may hold directories, created as
// needed: each target keeps its files in a directory of its own) and returns the path.
std::string write_file(const std::string& name, std::string_view bytes);

// Removes scratch_dir()/name if it is there.
void remove_file(const std::string& name);

// The input cut into at most `parts` pieces at each kSeparator (the last piece keeps the rest):
// how a target whose reader takes several files (a shard and its sidecars) gets them from one
// input. Missing pieces are absent from the result.
inline constexpr std::string_view kSeparator = "\n--8<--\n";
std::vector<std::string_view> split_parts(std::string_view input, size_t parts);

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace fuzz

#ifdef TRAINER_FUZZ_LIBFUZZER
#define TRAINER_FUZZ_TARGET(name) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#else
#define TRAINER_FUZZ_TARGET(name)                                  \
  static int fuzz_target_##name(const uint8_t* data, size_t size); \
  [[maybe_unused]] static const bool fuzz_registered_##name =      \
      ::fuzz::register_target(#name, fuzz_target_##name);          \
  static int fuzz_target_##name(const uint8_t* data, size_t size)
#endif
