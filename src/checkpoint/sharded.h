// Sharded checkpoints (checkpoint.format: sharded; docs/DESIGN.md "Checkpoints"): every rank
// writes what it holds of the run's state into one step directory, with no gather; rank 0 writes
// the manifest (io/shard_manifest.h) last.
//
// What a rank writes (shard_content):
// - sharded modes (the Reducer's buckets, ddp/shard.h): its block of every bucket's parameters
//   (under ddp.shard: parameters its fp32 master shard) and of both AdamW moments, as the tensors
//   "bucket_NNNNN.param", ".exp_avg", ".exp_avg_sq"; a piece per parameter it owns elements of;
// - unsharded: its slice (rank r of ceil(numel / world) elements) of every parameter and moment,
//   in the parameter's element order too;
// - rank 0 also the model's non-cache buffers, whole.
// So nothing is written twice, and every rank can compute every rank's pieces (rank 0 builds the
// manifest from them without receiving them). A parameter's three logical tensors take its element
// order (io::element_order of its strides; a channels-last weight's is not row-major), the order
// its bucket holds it in.
//
// Protocol (Checkpointer::save, then finish: checkpoint/checkpointer.h): each rank
// writes DIR.tmp/rank_NNNNN.safetensors (a temporary name, fsync'd, renamed), then every rank
// votes its file's size and CRC-32 (one all-gather on the control plane); if any rank failed, every
// rank throws the same CheckpointError. Rank 0 then writes manifest.json (temporary name, fsync'd,
// renamed) and renames DIR.tmp to DIR (commit_sharded_checkpoint). A directory without a complete
// manifest is not a checkpoint: a job killed while writing leaves the previous checkpoint the
// newest.
//
// Reading, two ways. Both verify every file against the manifest first (streamed CRC-32s: a
// missing or damaged file is CheckpointDamaged naming it).
// - read_sharded_checkpoint assembles whole tensors: the Checkpoint a single file gives (one
//   process: --consolidate, tests).
// - open_sharded_checkpoint reads no tensor data: the Checkpoint holds the manifest, and a
//   ShardedReader reads element ranges of logical tensors straight from the files. Resume takes
//   this way (docs/DESIGN.md "Checkpoints", "Who reads"): rank 0 chooses and checks the
//   checkpoint and reads the model's parameters into its model; every rank reads only the moments
//   it keeps (Checkpointer::resume), so no rank assembles state it does not keep.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "ddp/buckets.h"
#include "io/safetensors.h"
#include "io/shard_manifest.h"

namespace checkpoint {

// The run's state as the writer sees it on one rank.
struct ShardedState {
  std::vector<std::pair<std::string, at::Tensor>> params;   // named parameters (shape, dtype)
  std::vector<std::pair<std::string, at::Tensor>> buffers;  // "buffer.<name>", non-cache
  // Sharded: the Reducer's buckets; nullptr: unsharded.
  const std::vector<ddp::BucketLayout>* layout = nullptr;
  // This rank's state: sharded, one block per bucket (parameter_shards(), the optimizer's
  // per-bucket moments); unsharded, one full tensor per parameter (the moments).
  std::vector<at::Tensor> param_blocks, exp_avgs, exp_avg_sqs;
  // Per parameter: Muon's (its exp_avgs hold "muon.momentum.<name>", no second moment).
  std::vector<bool> muon;
};

struct ShardContent {
  std::vector<io::ShardPiece> pieces;
  std::map<std::string, at::Tensor> tensors;  // the file's tensors (views of the state)
};

// What `rank` of `world` writes. The tensors are filled only when `with_tensors` (the caller's own
// rank); the pieces are computed for any rank.
ShardContent shard_content(const ShardedState& state, int world, int rank, bool with_tensors);

// The manifest's logical tensors: every parameter, its two moments and every buffer.
std::map<std::string, io::LogicalTensor> logical_tensors(const ShardedState& state);

// Writes `tensors` (host copies, or the state itself when written before the step goes on:
// Note [A bounded shard write]) as step_tmp_dir/rank_NNNNN.safetensors: to a temporary name,
// fsync'd, renamed, with the checkpoint's `step` in its metadata (so that a file of another
// step is named as such: io::verify_shard_files). Creates the directory if needed. Returns the
// file's size and CRC-32 (pieces and rank left to the caller). Throws CheckpointError.
inline constexpr const char* kShardStepKey = "step";  // a shard file's metadata: its step
io::ShardFile write_shard_file(const std::string& step_tmp_dir, int rank, int64_t step,
                               const std::map<std::string, at::Tensor>& tensors);

// Rank 0, after every rank's file is complete: writes `step_dir`.tmp/manifest.json (temporary
// name, fsync'd, renamed), removes files the manifest does not name (left by an interrupted
// write), and renames the directory to `step_dir` (replacing one of the same name). Throws
// CheckpointError.
void commit_sharded_checkpoint(const std::string& step_dir, const io::ShardManifest& manifest);

// The element order of `t`'s strides (io::element_order; empty: row-major): the order a bucket
// holds a parameter in, which its logical tensors take in the manifest.
std::vector<int64_t> element_order_of(const at::Tensor& t);

// Reads and verifies a sharded checkpoint into whole tensors. Throws CheckpointDamaged (a
// missing, damaged or unlisted file, a manifest that does not parse) or CheckpointError.
Checkpoint read_sharded_checkpoint(const std::string& step_dir);

// Reads the manifest and verifies every file (size and CRC-32, streamed) and that its header holds
// the pieces the manifest places in it, reading no tensor data: a Checkpoint with `manifest` set
// and no tensors. Throws CheckpointDamaged or CheckpointError as read_sharded_checkpoint does.
Checkpoint open_sharded_checkpoint(const std::string& step_dir);

// --consolidate: the sharded checkpoint `step_dir` (every file verified first) written as the
// single-file format at `path`, one logical tensor at a time (read from the files, then written:
// checkpoint/single_file.h's write_checkpoint_streaming). Returns its metadata. Throws
// CheckpointDamaged or CheckpointError.
CheckpointMeta consolidate_sharded_checkpoint(const std::string& step_dir, const std::string& path);

// Element ranges of a sharded checkpoint's logical tensors, read straight from its files (a
// file's header when it is opened; then only the bytes asked for). At most `max_open_files` files
// are open at a time, the least recently used closed first, so that a reader of a checkpoint
// written by thousands of ranks stays within the process's file descriptors. Local: no
// collectives. Not thread-safe. Throws CheckpointDamaged naming the file and the tensor.
class ShardedReader {
 public:
  static constexpr size_t kMaxOpenFiles = 64;
  ShardedReader(std::string step_dir, io::ShardManifest manifest,
                size_t max_open_files = kMaxOpenFiles);

  const io::ShardManifest& manifest() const { return manifest_; }
  // Elements [offset, offset + out.numel()) of the logical tensor `name`, seen flat in its
  // element order (order(name)), into `out` (the logical dtype; any device and layout, taken
  // flat in its own row-major order: read through a host copy unless `out` is a contiguous CPU
  // tensor).
  void read(const std::string& name, int64_t offset, const at::Tensor& out);
  // The whole logical tensor into `out` (of its shape; any strides: elements go by index).
  void read_whole(const std::string& name, const at::Tensor& out);
  // The element order of `name` (io::LogicalTensor::order; empty: row-major).
  const std::vector<int64_t>& order(const std::string& name) const;
  // Checks that every file's header holds the pieces the manifest places in it (dtype and
  // elements). Reads headers only.
  void check_pieces();
  // Tensor bytes read from the files so far (headers not counted).
  int64_t bytes_read() const;
  // Files open now (at most max_open_files).
  size_t open_files() const { return files_.size(); }

 private:
  struct OpenFile {
    std::unique_ptr<io::SafetensorsRangeReader> reader;
    uint64_t last_use = 0;
  };
  // The open reader of `name`; valid until the next call (which may close it).
  io::SafetensorsRangeReader& file(const std::string& name);

  std::string dir_;
  io::ShardManifest manifest_;
  size_t max_open_files_;
  std::map<std::string, OpenFile> files_;
  uint64_t uses_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace checkpoint
