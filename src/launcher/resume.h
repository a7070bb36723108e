// Resume selection: the checkpoint a run continues from (checkpoint.resume), and the one whose
// weights --generate and --export-hf use. Rank 0 alone calls it; the Trainer broadcasts what it
// holds to the other ranks. A sharded checkpoint is opened, not read whole
// (checkpoint::ShardedRead::kOpen): its files are verified (streamed CRC-32s), the model's tensors
// are read from them, and checkpoint::Checkpointer::resume has every rank read the moments it
// keeps.
//
// For training (ResumeFor::kTraining):
// - "" (the default): none, start at step 1.
// - a file: that checkpoint.
// - "auto": the newest checkpoint in checkpoint.dir that verifies; damaged ones are passed over
//   with a warning each; when there is none yet, the run starts at step 1 and says so (a requeued
//   job's first attempt).
// For the weights of a command (ResumeFor::kWeights): a file as above; otherwise ("" or "auto")
// the newest checkpoint in checkpoint.dir that verifies, when checkpoint.dir is set; none is not
// an error (the caller decides what to do without weights).
//
// A checkpoint that cannot be read or does not fit the model is a checkpoint::CheckpointError whose
// message starts with the key that chose it ("checkpoint.resume: ", "checkpoint.dir: "). The
// chosen checkpoint's parameters are loaded into `model`.
#pragma once

#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/options.h"
#include "models/model.h"
#include "train/options.h"

namespace launcher {

enum class ResumeFor { kTraining, kWeights };

// For training, the checkpoint's moments must be those `optimizer` keeps (train.optimizer: muon:
// the momentum of the model's hidden matrices, AdamW's moments of the rest).
std::optional<checkpoint::Checkpoint> select_resume(
    const checkpoint::CheckpointOptions& options, models::Model& model,
    ResumeFor purpose = ResumeFor::kTraining,
    train::OptimizerKind optimizer = train::OptimizerKind::kAdamW);

// Whether a requeued job would continue from a checkpoint this run writes (checkpoint.dir set and
// checkpoint.resume: auto).
bool requeue_resumes(const checkpoint::CheckpointOptions& options);

}  // namespace launcher
