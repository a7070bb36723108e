// Options of the ddp section of the config (declared with defaults in launcher/config_schema.cpp).
#pragma once

#include <string>

namespace ddp {

struct DdpOptions {
  std::string backend;   // auto | nccl | mpi
  double timeout_s = 0;  // deadline of every collective
};

}  // namespace ddp
