#include "train/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace train {

std::string to_string(Precision precision) {
  return kPrecisionNames.at(static_cast<size_t>(precision));
}

AutocastScope::AutocastScope(c10::Device device, Precision precision) {
  if (precision == Precision::kFp32) return;
  type_ = device.type();
  was_enabled_ = at::autocast::is_autocast_enabled(type_);
  was_dtype_ = at::autocast::get_autocast_dtype(type_);
  at::autocast::set_autocast_dtype(type_,
                                   precision == Precision::kFp16 ? at::kHalf : at::kBFloat16);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The outermost scope drops the cached casts of the parameters (they change every step).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, was_enabled_);
  at::autocast::set_autocast_dtype(type_, was_dtype_);
}

std::string apply_device_flags(c10::Device device, Switch tf32, bool cudnn_benchmark) {
  if (!device.is_cuda()) return "CPU: train.tf32 and train.cudnn_benchmark do not apply";
  bool ampere = false;
  int major = 0;
#ifdef TRAINER_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) major = prop.major;
#endif
  ampere = major >= 8;
  const bool on = tf32 == Switch::kOn || (tf32 == Switch::kAuto && ampere);
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuBLAS(on);
  ctx.setAllowTF32CuDNN(on);
  ctx.setBenchmarkCuDNN(cudnn_benchmark);
  return fmt::format("TF32 matmuls and convolutions {} (train.tf32 = {}, compute capability {}.x); "
                     "cuDNN autotuning {}",
                     on ? "on" : "off", kSwitchNames.at(static_cast<size_t>(tf32)), major,
                     cudnn_benchmark ? "on" : "off");
}

bool tf32_enabled() { return at::globalContext().allowTF32CuBLAS(); }

double peak_tflops(c10::Device device, Precision precision, bool tf32_on, double configured) {
  if (configured > 0) return configured;
  if (!device.is_cuda()) return 0;
  std::string name;
#ifdef TRAINER_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) name = prop.name;
#endif
  struct Peak {
    const char* name;
    double bf16, tf32, fp32;
  };
  // Dense (no sparsity) datasheet figures, SXM parts.
  static const Peak table[] = {{"H200", 989.4, 494.7, 66.9},
                               {"H100", 989.4, 494.7, 66.9},
                               {"A100", 312.0, 156.0, 19.5},
                               {"L40S", 362.1, 183.0, 91.6}};
  for (const auto& p : table) {
    if (name.find(p.name) != std::string::npos) {
      return precision != Precision::kFp32 ? p.bf16 : (tf32_on ? p.tf32 : p.fp32);
    }
  }
  return 0;
}

}  // namespace train
