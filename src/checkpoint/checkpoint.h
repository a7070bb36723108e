// The checkpoint component's vocabulary: what a checkpoint is once read (Checkpoint), what it
// records of the run (CheckpointMeta), its errors, and the key names of a run's state. The
// formats are in single_file.h and sharded.h, reading either in read.h, the files of a
// checkpoint directory in files.h, and writing and resuming a run's state in checkpointer.h
// (docs/DESIGN.md, "Checkpoints").
//
// The seed and the step are the run's whole random state: the rank sampler's order is a function
// of (seed, step) (ddp/rank_sampler.h), and the default generators that dropout draws from are
// reseeded from (seed, step, rank) at the start of every step (train/step_rng.h), so a run
// resumed from a checkpoint on as many ranks continues exactly as the uninterrupted one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/shard_manifest.h"

namespace checkpoint {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // A failed system call while writing (open, write, fsync, rename, mkdir) with its errno.
  CheckpointError(const std::string& what, int error_number)
      : std::runtime_error(what), error_number_(error_number) {}
  int error_number() const { return error_number_; }  // 0: not a system call's failure

 private:
  int error_number_ = 0;
};

// Whether `error_number` says the file system is out of space: ENOSPC (the disk is full) or
// EDQUOT (the user's quota is spent). Only these are retried (docs/DESIGN.md, "A failed write").
bool out_of_space(int error_number);

// The job stops because a checkpoint could not be written (exit code 5, "disk"): a periodic
// checkpoint after checkpoint.max_failed_writes failed in a row for want of space, any checkpoint
// the file system refused otherwise (an I/O error, a read-only file system, no permission), and
// the final checkpoint or one that ends a job, whatever the file system said. Every rank throws it
// after the same vote (Checkpointer::finish).
class CheckpointNotWritten : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A checkpoint whose data does not verify (damaged, truncated, empty): resume "auto" passes over
// it to an older one.
class CheckpointDamaged : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  int64_t global_batch_size = 0;
  uint64_t seed = 0;
  int world_size = 0;
  std::string config;  // the run's effective configuration (YAML); may be empty
  // The learning-rate schedule's plan (train/schedule.h, written and read by the Trainer as
  // text); empty in older checkpoints.
  std::string schedule;
  // LoRA (models::FrozenBase): the frozen base the adapters belong to, which the checkpoint does
  // not hold: its path (model.init_from) and models::FrozenBase::base_hash(); empty otherwise.
  std::string base;
  std::string base_hash;

  // A LoRA run's checkpoint: the adapters alone, over the frozen base base_hash names.
  bool adapters_only() const { return !base_hash.empty(); }
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
// The key of Muon's momentum for the matrix named `param` ("muon.momentum.<name>").
std::string muon_momentum_key(const std::string& param);
// A parameter's optimizer state is held in two moments (FusedAdamW's, train/optimizer.h); for a
// matrix Muon updates (`muon`), the first holds its momentum and the second is unused and not
// written. The keys of the two: AdamW's, or Muon's momentum and "" (none).
std::string first_moment_key(const std::string& param, bool muon);
std::string second_moment_key(const std::string& param, bool muon);
// Whether the parameter at `index` is one of `muon`'s (per parameter; empty: none is).
inline bool is_muon(const std::vector<bool>& muon, size_t index) {
  return index < muon.size() && muon[index];
}
// The key of the parameter named `name` ("param.<name>": io/checkpoint_keys.h).
std::string param_key(const std::string& name);

// A single file's "format" metadata.
inline constexpr const char* kSingleFileFormat = "trainer-checkpoint-1";

// The number under metadata `key` of the file `path`. Throws CheckpointError naming both.
int64_t metadata_number(const std::string& path, const std::map<std::string, std::string>& meta,
                        const char* key);
uint64_t metadata_unsigned(const std::string& path, const std::map<std::string, std::string>& meta,
                           const char* key);

}  // namespace checkpoint
