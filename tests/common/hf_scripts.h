// What the tests against Hugging Face's Python libraries share (tests/hf/*.py, offline, random
// models): running one of the scripts, and comparing what it wrote. For test binaries whose
// target defines TRAINER_SOURCE_DIR and TRAINER_PYTHON (tests/unit/CMakeLists.txt).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/python_runner.h"
#include "common/temp_dir.h"

namespace test {

// Runs tests/hf/`script` with `args` (its output into `dir`/script.log); fails the test with that
// output when it fails.
inline bool run_hf_script(const std::string& script, const std::string& args, const TempDir& dir) {
  const std::string log = dir.file("script.log");
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/tests/hf/" + script;
  const int rc = run_python(path, args, log);
  if (rc == 0) return true;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ADD_FAILURE() << "failed (" << rc << "): " << path << " " << args << "\n" << text;
  return false;
}

// The largest elementwise difference of two tensors of one shape, in double.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// A tensor of token ids as a list.
inline std::vector<int64_t> ids_of(const at::Tensor& t) {
  const at::Tensor c = t.reshape({-1}).to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace test
