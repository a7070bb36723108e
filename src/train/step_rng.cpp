#include "train/step_rng.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <mutex>

#include "core/splitmix.h"

namespace train {
namespace {

using core::splitmix64;

// Keeps these streams apart from other uses of splitmix64 on the same seed (the image crops).
constexpr uint64_t kStepStream = 0x5354455052414E44ULL;  // "STEPRAND"

void reseed(at::Generator gen, uint64_t seed) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);  // also drops a cached normal sample (CPU) / resets the offset (CUDA)
}

}  // namespace

uint64_t step_seed(uint64_t seed, int64_t step, int rank) {
  uint64_t h = splitmix64(seed ^ kStepStream);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  return splitmix64(h ^ static_cast<uint64_t>(rank));
}

void seed_step_generators(uint64_t seed, int64_t step, int rank, c10::Device device) {
  const uint64_t s = step_seed(seed, step, rank);
  reseed(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)), s);
#ifdef TRAINER_HAVE_CUDA
  // Host only: CUDAGeneratorImpl::set_current_seed stores the seed and zeroes the Philox offset.
  if (device.is_cuda()) reseed(at::globalContext().defaultGenerator(device), s);
#endif
}

}  // namespace train
