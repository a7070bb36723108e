// The precomputed reference of train.objective: dpo without adapters (full fine-tuning;
// train/objective.h): the initial weights' log-probabilities of every pair's completions, in one
// pass over the training and validation splits before step 1, kept in the run directory and read
// back on resume (the weights are no longer the initial ones then).
//
//   DIR/reference_logps.safetensors   "train" float64 [pairs, 2], "validation" [pairs, 2]
//                                     (chosen, rejected), metadata "objective": "dpo"
//
// Each rank computes a contiguous slice of each split (eval_slice) in batches of the micro-batch's
// pairs, without gradient, in eval mode, under the training precision's autocast; one SUM
// all-reduce per split gives every rank the whole table. A resumed run reads the table beside the
// checkpoint it resumes (rank 0, then a broadcast) and keeps it in its own directory; none there,
// or one of other sizes than its data's, stops every rank with exit 2 naming the file.
#pragma once

#include <string>

#include "train/trainer.h"

namespace train {

inline constexpr char kReferenceFile[] = "reference_logps.safetensors";

// Fills trainer.objective()'s tables when it needs precomputed ones: `resumed_from` (rank 0's
// checkpoint path; "" when not resuming, and on the other ranks) says whether they are read or
// computed; rank 0 writes them into `dir` (checkpoint.dir; "" none). Rank 0 logs which reference
// the run uses (for every preference objective). Collective (for dpo without adapters).
void prepare_reference(Trainer& trainer, const std::string& dir, const std::string& resumed_from);

}  // namespace train
