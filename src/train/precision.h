// Precision: automatic mixed precision for forward and loss (train.precision), and the device's
// math flags (train.tf32, train.cudnn_benchmark).
//
// bf16: forward and loss run under LibTorch's autocast for the training device (matmuls and
// convolutions in bfloat16, reductions and losses in float32, as autocast's op lists decide);
// parameters, gradients, the all-reduce and AdamW stay float32. Backward runs outside the
// autocast region, as autocast requires. bf16 needs no loss scaling (its exponent range is
// float32's). CPU autocast supports bf16, so the path runs on CPU as well as on a GPU.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "train/options.h"

namespace train {

std::string to_string(Precision precision);

// Autocast on `device` for the scope of the object (nothing for fp32). Restores the previous
// state and clears autocast's cast cache when it ends. Not copyable; one thread.
class AutocastScope {
 public:
  AutocastScope(c10::Device device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Float;
};

// Sets the math flags of a CUDA device and returns a line for the log:
//   tf32 auto (TF32 matmuls and convolutions on Ampere (compute capability 8.0) and newer), on
//   or off; cudnn_benchmark: let cuDNN time its algorithms for each new shape.
// On CPU it changes nothing and says so.
std::string apply_device_flags(c10::Device device, Switch tf32, bool cudnn_benchmark);

// Dense peak TFLOP/s of the device for the precision (train.peak_tflops when > 0, else a table of
// known GPUs by name: H100, H200, A100, L40S; the TF32 figure for fp32 with TF32 on). 0 where
// unknown (CPU): MFU is then not logged.
double peak_tflops(c10::Device device, Precision precision, bool tf32_on, double configured);

// Whether TF32 is on for CUDA matmuls (after apply_device_flags).
bool tf32_enabled();

}  // namespace train
