// Reading a checkpoint of either format for a model: read_checkpoint takes a file or a sharded
// checkpoint's step directory; check_compatible and apply_model_state run on one rank (rank 0)
// before any collective, so that every problem (missing, empty, truncated or damaged files,
// tensor data whose checksum differs, another format, a parameter, buffer or moment that is
// missing or has another shape or dtype) is a CheckpointError naming the file and the tensor.
// apply_model_state copies parameters and buffers into the model (the Trainer then broadcasts
// them); the Checkpointer restores the moments (checkpoint/checkpointer.h).
//
// A sharded checkpoint opened for resume (ShardedRead::kOpen) holds its manifest and no tensors:
// check_compatible checks the manifest's logical tensors, apply_model_state reads the model's
// tensors straight from the files, and Checkpointer::resume has every rank read its own moments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "models/deferred_init.h"
#include "models/model.h"

namespace checkpoint {

// Reads a checkpoint: a file, or a sharded checkpoint's step directory (checkpoint/sharded.h),
// into whole tensors unless `sharded` is kOpen. Throws CheckpointError.
Checkpoint read_checkpoint(const std::string& path, ShardedRead sharded = ShardedRead::kWhole);

// What a checkpoint (a file or a step directory) holds, from its header or manifest alone: its
// tensors' names, shapes and dtypes as a manifest's logical tensors, its LoRA base and step;
// nothing verified and no tensor data read. Enough for check_compatible, not for reading.
// Throws CheckpointDamaged naming the file when the header cannot be read.
Checkpoint read_checkpoint_header(const std::string& path);

// Throws CheckpointError unless the checkpoint's LoRA base (CheckpointMeta::base_hash) is the
// model's (models::FrozenBase; neither has one without adapters), naming both bases, and unless
// `ckpt` holds exactly the parameters (with moments) and non-cache
// buffers of `model`, with the same shapes and dtypes (an opened sharded checkpoint: its
// manifest's logical tensors; the same messages). The moments are the optimizer's of the run:
// `muon` names the matrices whose state is Muon's momentum (train.optimizer: muon; empty:
// adamw); nullopt accepts either for each parameter (only the weights are used: --generate,
// --export-hf).
void check_compatible(
    const Checkpoint& ckpt, models::Model& model,
    const std::optional<std::vector<std::string>>& muon = std::vector<std::string>{});

// Copies the checkpoint's parameters and non-cache buffers into `model` (an opened sharded
// checkpoint: read from its files straight into the model's tensors).
void apply_model_state(const Checkpoint& ckpt, models::Model& model);

// A checkpoint's parameters by element ranges (models/deferred_init.h's ParameterReader), for an
// export that streams: an opened sharded checkpoint's files, read by ranges (ShardedReader), or
// a read file's tensors. Throws CheckpointDamaged naming the file.
models::ParameterReader parameter_reader(const Checkpoint& ckpt);

// The newest checkpoint in `dir` that reads and verifies; the ones passed over and why go to
// `skipped` ("" and none when there is none). Throws only for problems that are not damage.
std::string newest_good_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                   Checkpoint* out, ShardedRead sharded = ShardedRead::kWhole);

}  // namespace checkpoint
