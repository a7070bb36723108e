// Options of the ddp section of the config (declared with defaults in launcher/config_schema.cpp).
#pragma once

#include <string>

namespace ddp {

struct DdpOptions {
  std::string backend;           // auto | nccl | mpi
  double timeout_s = 0;          // deadline of every collective
  double first_bucket_mb = 0;    // cap of the first gradient bucket
  double bucket_mb = 0;          // cap of the other buckets
  bool find_unused_parameters = false;
  std::string reduce_dtype;      // fp32 | bf16: dtype of the gradient all-reduce
  std::string shard = "none";    // none | optimizer | gradients (ddp/shard.h)
};

}  // namespace ddp
