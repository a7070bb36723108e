// Checkpoints: everything needed to resume a run, in one safetensors file (readable from Python
// with safetensors.torch.load_file).
//
// Contents: "param.<name>" for every parameter, "buffer.<name>" for every buffer except embedding
// caches (rebuilt on resume), "adamw.exp_avg.<name>" and "adamw.exp_avg_sq.<name>" for AdamW's
// moments, and string metadata: the format, the optimizer steps completed ("step"), the global
// batch size, seed and world size the run had, the run's configuration (YAML) when known, and a
// CRC-32 of every tensor's name and bytes in name order ("checksum": "crc32:xxxxxxxx").
//
// The seed and the step are the run's whole random state: the rank sampler's order is a function
// of (seed, step) (ddp/rank_sampler.h), and the default generators that dropout draws from are
// reseeded from (seed, step, rank) at the start of every step (train/step_rng.h), so a run
// resumed from a checkpoint on as many ranks continues exactly as the uninterrupted one.
//
// Contract:
// - write_checkpoint writes a temporary file next to `path`, fsyncs it, renames it into place and
//   fsyncs the directory, so a job killed while writing leaves the previous checkpoint whole.
// - read_checkpoint + check_compatible run on one rank (rank 0) before any collective; every
//   problem (missing, empty, truncated or damaged file, tensor data whose checksum differs from
//   the metadata's, another format, a parameter, buffer or moment that is missing or has another
//   shape or dtype) is a CheckpointError naming the file and the tensor.
// - apply_model_state copies parameters and buffers into the model (on rank 0; the Trainer then
//   broadcasts them); the Trainer restores the moments and the step itself (Trainer::resume).
// - A sharded checkpoint opened for resume (ShardedRead::kOpen) holds its manifest and no
//   tensors: check_compatible checks the manifest's logical tensors, apply_model_state reads the
//   model's tensors straight from the files, and Trainer::resume has every rank read its own
//   moments (train/checkpoint_sharded.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/shard_manifest.h"
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
  std::string config;  // the run's effective configuration (YAML); may be empty
};

// A checkpoint whose data does not verify (damaged, truncated, empty): resume "auto" passes over
// it to an older one.
class CheckpointDamaged : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct Checkpoint {
  std::string path;
  CheckpointMeta meta;
  std::map<std::string, at::Tensor> tensors;  // CPU; empty when opened (`manifest`)
  // A sharded checkpoint opened, not read (ShardedRead::kOpen): where every element lies.
  std::optional<io::ShardManifest> manifest;
};

// How read_checkpoint takes a sharded checkpoint's step directory: kWhole assembles every tensor
// (one process: --consolidate, tests); kOpen verifies the files and reads no tensor data
// (resume: each rank reads its ranges). A single file is read whole either way.
enum class ShardedRead { kWhole, kOpen };

// Keys of AdamW's moments for the parameter named `param`.
std::string exp_avg_key(const std::string& param);
std::string exp_avg_sq_key(const std::string& param);

// The model's tensors in a checkpoint, under their keys: "param.<name>" first (the likeliest to
// differ and the clearest to report), then "buffer.<name>" for every buffer but the caches
// (build_cache() rebuilds those).
std::vector<std::pair<std::string, at::Tensor>> model_entries(models::Model& model);

// What a single-file checkpoint holds under its keys: the model's entries (model_entries) and
// AdamW's moments (one pair per parameter, in named_parameters() order). Views, not copies.
std::map<std::string, at::Tensor> checkpoint_tensors(models::Model& model,
                                                     const std::vector<at::Tensor>& exp_avgs,
                                                     const std::vector<at::Tensor>& exp_avg_sqs);

// Rank 0 writes: the model (parameters, non-cache buffers), AdamW's moments (one pair per
// parameter, in named_parameters() order) and `meta`. Throws CheckpointError.
void write_checkpoint(const std::string& path, models::Model& model,
                      const std::vector<at::Tensor>& exp_avgs,
                      const std::vector<at::Tensor>& exp_avg_sqs, const CheckpointMeta& meta);

// The same file from the tensors under their keys (as read_checkpoint gives them: --consolidate).
void write_checkpoint_tensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const CheckpointMeta& meta);

// Reads a checkpoint: a file, or a sharded checkpoint's step directory
// (train/checkpoint_sharded.h), into whole tensors unless `sharded` is kOpen. Throws
// CheckpointError.
Checkpoint read_checkpoint(const std::string& path, ShardedRead sharded = ShardedRead::kWhole);

// Throws CheckpointError unless `ckpt` holds exactly the parameters (with moments) and non-cache
// buffers of `model`, with the same shapes and dtypes (an opened sharded checkpoint: its
// manifest's logical tensors; the same messages).
void check_compatible(const Checkpoint& ckpt, models::Model& model);

// Copies the checkpoint's parameters and non-cache buffers into `model` (an opened sharded
// checkpoint: read from its files straight into the model's tensors).
void apply_model_state(const Checkpoint& ckpt, models::Model& model);

// Creates `dir` if needed and checks that a file can be written there, so that a typo in
// checkpoint.dir stops the job at start-up instead of at its first checkpoint, hours later.
// Throws CheckpointError naming the key and the directory.
void check_checkpoint_dir(const std::string& dir);

// The checkpoint in `dir` with the most steps completed (read from each *.safetensors file's
// metadata; files that are not checkpoints are ignored); "" when there is none.
std::string latest_checkpoint(const std::string& dir);

// Every checkpoint file in `dir`, the most steps first (ties: by name); files whose header cannot
// be read come first (they cannot be ordered, and read_checkpoint says at once how they are
// damaged).
std::vector<std::string> checkpoints_newest_first(const std::string& dir);

// The newest checkpoint in `dir` that reads and verifies; the ones passed over and why go to
// `skipped` ("" and none when there is none). Throws only for problems that are not damage.
std::string newest_good_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                   Checkpoint* out, ShardedRead sharded = ShardedRead::kWhole);

// checkpoint.keep_last: deletes periodic checkpoints (step_N.safetensors) of `dir` other than the
// `keep` with the most steps; final and out-of-memory checkpoints stay. keep <= 0: none deleted.
// Returns the deleted paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep);

// What interrupted writes left in `dir`: checkpoint names (step_N, final, oom_step_N, as files or
// step directories) with ".tmp" appended, except `keep` (the one being committed). Removes them
// (a directory one level deep) and returns the removed paths. Rank 0, while no other write is in
// flight.
std::vector<std::string> remove_unfinished_writes(const std::string& dir, const std::string& keep);

}  // namespace train
