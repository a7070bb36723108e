// Bucket assignment: which parameters share a flat gradient buffer, and in which order buckets
// are reduced. A pure function of the parameter list, so every rank computes the same layout.
//
// Parameters are taken in reverse registration order (gradients of the last layers are ready
// first in backward). A bucket holds one dtype on one device; it closes when the next parameter
// would take it past its cap: the first bucket of each (dtype, device) is capped at
// `first_bucket_bytes` (small, so communication starts early), the rest at `bucket_bytes`. A
// parameter larger than the cap gets a bucket of its own. Buckets are ordered by when they start
// filling, i.e. by the reverse-order position of their first parameter.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace ddp {

struct ParamMeta {
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};
};

struct BucketLayout {
  std::vector<size_t> params;    // indices into the parameter list, in reverse registration order
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};

  int64_t bytes() const { return numel * static_cast<int64_t>(c10::elementSize(dtype)); }
};

std::vector<BucketLayout> assign_buckets(const std::vector<ParamMeta>& params,
                                         int64_t first_bucket_bytes, int64_t bucket_bytes);

}  // namespace ddp
