// Options of the training loop (the train and checkpoint sections of the config; every key is
// declared with its default in launcher/config_schema.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "ddp/options.h"
#include "memory/options.h"

namespace train {

struct TrainOptions {
  std::string device;           // auto | cpu | cuda
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;  // 0: auto
  int64_t steps = 0;
  double lr = 0;
  double min_lr_ratio = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double grad_clip = 0;  // 0: no clipping
  uint64_t seed = 0;
  int64_t threads = 0;   // 0: cores / local ranks
  int64_t eval_every = 0;  // movielens: HR@10 / NDCG@10 every N steps (0: after the last step only)
};

struct CheckpointOptions {
  std::string dir;    // empty: no checkpoints
  int64_t every = 0;  // 0: only at the end
  std::string resume;  // a checkpoint file, "auto" (the latest in dir, if any) or empty
};

struct LogOptions {
  std::string level;
  int64_t every = 0;
};

// Everything the Trainer is configured with.
struct TrainerOptions {
  TrainOptions train;
  ddp::DdpOptions ddp;
  memory::MemoryOptions memory;
  CheckpointOptions checkpoint;
  LogOptions log;
};

}  // namespace train
