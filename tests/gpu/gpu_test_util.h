// What the gpu tier's test files share (gpu_test.cpp, gpu_step_test.cpp): the skip where no CUDA
// device is, the NCCL communicator at world size 1, and a token shard for the Trainer's runs.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "ddp/communicator.h"
#include "ddp/nccl_communicator.h"

// Skips only where no CUDA device is (ctest's SKIP_REGULAR_EXPRESSION matches that text). A
// device without NCCL in the build is a failure, not a skip: the tier would otherwise pass having
// tested nothing on a GPU machine.
#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (torch::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";  \
    if (!ddp::nccl_available()) {                                                            \
      GTEST_FAIL() << "a CUDA device is present but this build has no NCCL (it needs the "   \
                      "CUDA toolkit and nccl.h at configure time: cmake/TrainerDeps.cmake)"; \
    }                                                                                        \
  } while (0)

namespace test {

inline std::unique_ptr<ddp::Communicator> nccl(ddp::Communicator& control) {
  return ddp::make_nccl_communicator(control, 0, std::chrono::seconds(60));
}

// A nanoGPT-style shard of 20000 tokens below 251 in `dir`/train_000.bin.
inline void write_token_shard(const std::string& dir) {
  const at::Tensor tokens = (at::arange(20000, at::kLong) * 7919 % 251).to(at::kShort);
  FILE* f = std::fopen((dir + "/train_000.bin").c_str(), "wb");
  std::fwrite(tokens.data_ptr(), 2, tokens.numel(), f);
  std::fclose(f);
}

}  // namespace test
