// Checkpointer: writes a run's state as checkpoints and reads it back on resume, beside the
// training step (docs/DESIGN.md, "Checkpoints"). The Trainer hands it the state to write and
// the state to read into (RunState: views of the model, the Reducer's buckets and AdamW's
// moments) and nothing else; the loop decides when (train/loop.h).
//
// A checkpoint is written in two halves:
// - save (the step waits for it): the copy of the state to host memory (single-file: after the
//   gathers to rank 0), then the write of this rank's file starts, on a background thread under
//   checkpoint.async, else at once on this thread;
// - finish (the next checkpoint, or the end of the run, waits for it): the write is waited for,
//   every rank votes on its file (one all-gather on the control plane), and rank 0 commits (the
//   manifest and the directory's rename; a single file renamed itself into place), removes what
//   interrupted writes left and applies checkpoint.keep_last.
// The background thread touches only its host copies and files: no collective, no device, no
// spdlog. One write is in flight at a time.
//
// Formats (checkpoint.format): single (rank 0 gathers and writes one file:
// checkpoint/single_file.h) and sharded (every rank writes its shard of a step directory:
// checkpoint/sharded.h); auto is sharded when ddp.shard is configured not none, so that a run a
// fallback rung shards keeps its format.
//
// Contract: every call is collective (every rank, in the same order); a failed write on any rank
// is the same outcome on every rank at finish(), decided from the votes: a periodic checkpoint
// (Need::kMayFail) the file system had no space for (ENOSPC, EDQUOT) is a warning, and training
// goes on, until checkpoint.max_failed_writes of them fail in a row; then, or for any checkpoint
// another failed system call refused, or for a required one, CheckpointNotWritten (exit code 5);
// any other failure, CheckpointError. Rank 0 removes a failed write's partial files. Destroyed
// with a write pending (an error ended the run), it waits for the write and commits nothing, so
// that write is not a checkpoint.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/options.h"
#include "ddp/communicator.h"
#include "ddp/options.h"
#include "ddp/reducer.h"
#include "models/model.h"

namespace checkpoint {

struct PendingCheckpoint;
struct WriteFailure;

// Whether a checkpoint may fail for want of space while the run goes on (a periodic one), or must
// be written (the final one, and those that end a job).
enum class Need { kMayFail, kRequired };

// The communicators a checkpoint uses (the Trainer's).
struct CheckpointComms {
  ddp::Communicator& control;   // the votes, and the step and path broadcasts of resume
  ddp::Communicator& data;      // resume: the unsharded moments' broadcast from rank 0
  ddp::Communicator& shard;     // the ranks a shard spans: one file each (sharded format)
  ddp::Communicator* replicas;  // hybrid sharding: the ranks each shard is replicated over
};

// What every checkpoint records of the run besides its state.
struct RunRecord {
  int64_t global_batch_size = 0;
  uint64_t seed = 0;
  std::string config_text;            // the effective configuration (YAML)
  ddp::ShardMode configured_shard{};  // ddp.shard as configured (checkpoint.format: auto)
  // LoRA: the frozen base (CheckpointMeta::base, base_hash); empty otherwise.
  std::string base;
  std::string base_hash;
};

// A run's state on this rank, as the Trainer holds it: views, not copies. The Checkpointer writes
// it, and reads a checkpoint into it (in place) on resume.
struct RunState {
  models::Model* model = nullptr;
  ddp::Reducer* reducer = nullptr;  // the buckets: layout, blocks, unshard, shard_from
  // AdamW's moments: one per parameter (unsharded), or this rank's block of each bucket.
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs;
  // Per parameter: a matrix whose state is Muon's momentum, in exp_avgs' elements (written as
  // "muon.momentum.<name>"; its exp_avg_sqs elements are unused and not written). Empty: none.
  std::vector<bool> muon;
  // ddp.shard: parameters: gathers every unit's parameters while the returned handle lives
  // (collective), not their frozen tensors (LoRA's base, which no checkpoint holds); empty
  // otherwise. The single file needs the whole model.
  std::function<std::shared_ptr<void>()> gather_units;
  // The learning-rate schedule's plan as text (CheckpointMeta::schedule): written with every
  // checkpoint; resume() hands the checkpoint's, with its steps done, to `resume_schedule` on
  // every rank (not called when the checkpoint has none).
  std::string schedule;
  std::function<void(int64_t steps_done, const std::string& plan)> resume_schedule;
  // ddp.shard: parameters with a model built without storage (models/deferred_init.h): no rank
  // holds the model, so resume reads the parameters' master blocks (reducer->parameter_shards())
  // as it reads the moments, each rank its own; rank 0 applied only the buffers.
  bool parameter_blocks = false;
};

class Checkpointer {
 public:
  Checkpointer(CheckpointOptions options, RunRecord record, CheckpointComms comms);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  const CheckpointOptions& options() const { return options_; }
  // Whether checkpoints are written sharded (checkpoint.format).
  bool sharded() const;
  // "DIR/NAME.safetensors": the path a checkpoint named NAME (step_000100, final, ...) is saved
  // under (sharded: the step directory DIR/NAME).
  std::string path_of(const std::string& name) const;

  // Writes a checkpoint of `state` with `steps_done` optimizer steps to `path`
  // (".../NAME.safetensors"; sharded: the directory ".../NAME"). First finishes the previous one.
  // The state is copied to host memory before it returns; under checkpoint.async the files are
  // written in the background and the checkpoint is complete only after finish(), otherwise at
  // once. Collective. Returns what is written (the file or the directory).
  std::string save(const std::string& path, int64_t steps_done, const RunState& state,
                   Need need = Need::kRequired);
  // Waits for the checkpoint being written (if any), then every rank votes on its file and rank 0
  // commits it, removes what interrupted writes left and applies checkpoint.keep_last. Collective;
  // a no-op on every rank when nothing is pending. A failed write: see the contract above.
  void finish();

  // Continues from a checkpoint that rank 0 read (and whose parameters and buffers it applied to
  // the model: the Trainer broadcast them). Other ranks pass nullptr; so does rank 0 when there is
  // nothing to resume. Reads AdamW's moments into `state`: a checkpoint read whole, broadcast from
  // rank 0 (sharded modes: each rank keeps its blocks); a sharded one opened (ShardedRead::kOpen),
  // its path goes to every rank and each reads only the moments it keeps from the files (sharded
  // modes: its blocks; unsharded: the whole moments); a rank that cannot read its part fails
  // every rank, naming the file (voted). Returns the optimizer steps done (0: nothing resumed).
  // Collective.
  int64_t resume(const Checkpoint* ckpt, const RunState& state);
  // Tensor bytes this rank read from a sharded checkpoint's files in resume() (a test hook).
  int64_t resume_bytes_read() const { return resume_bytes_read_; }

 private:
  std::unique_ptr<PendingCheckpoint> start_single(const std::string& path, int64_t steps_done,
                                                  const RunState& state);
  std::unique_ptr<PendingCheckpoint> start_sharded(const std::string& step_dir, int64_t steps_done,
                                                   const RunState& state);
  // rank 0's log line of a committed checkpoint
  void log_written(const PendingCheckpoint& p, double write_s, double waited_s,
                   double vote_s) const;
  // resume() from an opened sharded checkpoint (`manifest`: rank 0's, verified; nullptr: read
  // it). Voted.
  void read_own_moments(const std::string& step_dir, const io::ShardManifest* manifest,
                        const RunState& state);
  CheckpointMeta meta(int64_t steps_done, const RunState& state) const;
  // Rank 0's commit of a sharded checkpoint, as a vote ("nothing": done).
  static std::string commit_vote(const PendingCheckpoint& p);
  // After a failed write (the same `failure` on every rank): removes its partial files (rank 0),
  // then warns and returns, or throws (the contract above).
  void give_up_or_go_on(const PendingCheckpoint& p, const WriteFailure& failure);

  CheckpointOptions options_;
  RunRecord record_;
  CheckpointComms comms_;
  // Written, not yet committed.
  std::unique_ptr<PendingCheckpoint> pending_;
  int64_t failed_writes_ = 0;  // checkpoints that failed in a row (the same on every rank)
  // The last checkpoint this run committed, else the one it resumed from (rank 0's, for messages).
  std::string last_complete_;
  int64_t resume_bytes_read_ = 0;
};

}  // namespace checkpoint
