// Resume selection (checkpoint.resume): the checkpoint a run continues from. Rank 0 alone calls
// it; the Trainer broadcasts what it holds to the other ranks.
//
// - "" (the default): none, start at step 1.
// - a file: that checkpoint.
// - "auto": the newest checkpoint in checkpoint.dir that verifies; damaged ones are passed over
//   with a warning each; when there is none yet, the run starts at step 1 and says so (a requeued
//   job's first attempt).
// A checkpoint that cannot be read or does not fit the model is a train::CheckpointError whose
// message starts with "checkpoint.resume: ". The chosen checkpoint's parameters are loaded into
// `model`.
#pragma once

#include <optional>

#include "models/model.h"
#include "train/checkpoint.h"
#include "train/options.h"

namespace launcher {

std::optional<train::Checkpoint> select_resume(const train::CheckpointOptions& options,
                                               models::Model& model);

// Whether a requeued job would continue from a checkpoint this run writes (checkpoint.dir set and
// checkpoint.resume: auto).
bool requeue_resumes(const train::CheckpointOptions& options);

}  // namespace launcher
