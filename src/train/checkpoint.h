// Checkpoints: everything needed to resume a run, in one safetensors file (readable from Python
// with safetensors.torch.load_file).
//
// Contents: "param.<name>" for every parameter, "buffer.<name>" for every buffer except embedding
// caches (rebuilt on resume), "adamw.exp_avg.<name>" and "adamw.exp_avg_sq.<name>" for AdamW's
// moments, and string metadata: the format, the optimizer steps completed ("step"), the global
// batch size, seed and world size the run had.
//
// Contract:
// - write_checkpoint writes a temporary file next to `path` and renames it into place, so a job
//   killed while writing leaves the previous checkpoint whole.
// - read_checkpoint + check_compatible run on one rank (rank 0) before any collective; every
//   problem (missing or damaged file, another format, a parameter, buffer or moment that is
//   missing or has another shape or dtype) is a CheckpointError naming the file and the tensor.
// - apply_model_state copies parameters and buffers into the model (on rank 0; the Trainer then
//   broadcasts them); the Trainer restores the moments and the step itself (Trainer::resume).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/model.h"

namespace train {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  int64_t global_batch_size = 0;
  uint64_t seed = 0;
  int world_size = 0;
};

struct Checkpoint {
  std::string path;
  CheckpointMeta meta;
  std::map<std::string, at::Tensor> tensors;  // CPU
};

// Keys of AdamW's moments for the parameter named `param`.
std::string exp_avg_key(const std::string& param);
std::string exp_avg_sq_key(const std::string& param);

// Rank 0 writes: the model (parameters, non-cache buffers), AdamW's moments (one pair per
// parameter, in named_parameters() order) and `meta`. Throws CheckpointError.
void write_checkpoint(const std::string& path, models::Model& model,
                      const std::vector<at::Tensor>& exp_avgs,
                      const std::vector<at::Tensor>& exp_avg_sqs, const CheckpointMeta& meta);

// Reads a checkpoint file. Throws CheckpointError.
Checkpoint read_checkpoint(const std::string& path);

// Throws CheckpointError unless `ckpt` holds exactly the parameters (with moments) and non-cache
// buffers of `model`, with the same shapes and dtypes.
void check_compatible(const Checkpoint& ckpt, models::Model& model);

// Copies the checkpoint's parameters and non-cache buffers into `model`.
void apply_model_state(const Checkpoint& ckpt, models::Model& model);

// Creates `dir` if needed and checks that a file can be written there, so that a typo in
// checkpoint.dir stops the job at start-up instead of at its first checkpoint, hours later.
// Throws CheckpointError naming the key and the directory.
void check_checkpoint_dir(const std::string& dir);

// The checkpoint in `dir` with the most steps completed (read from each *.safetensors file's
// metadata; files that are not checkpoints are ignored); "" when there is none.
std::string latest_checkpoint(const std::string& dir);

}  // namespace train
