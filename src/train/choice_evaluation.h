// Multiple-choice evaluation (eval.tasks; data/choice_tasks.h reads the files), scored as llm.c
// scores HellaSwag: each ending follows the context; its loss is the next-token cross-entropy of
// the model over the ending's tokens (each predicted from the context and the ending's earlier
// tokens).
//   acc       the example counts when the ending with the lowest summed loss is the label;
//   acc_norm  the same with the lowest mean loss per token of the ending.
// (lm-eval's acc_norm divides by the ending's bytes instead of its tokens: the two differ.)
// Ties go to the first ending. The counts are exact integers.
//
// Distributed: rank r of W scores a contiguous slice of the examples (the batch plan's rule: n / W
// each, the first n mod W ranks one more); one SUM all-reduce on `control` of (acc, acc_norm,
// examples) gives every rank the same counts. Every rank issues exactly that one collective per
// task, also with an empty slice. Needs a models::LanguageModel (its logits over the vocabulary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/choice_tasks.h"
#include "ddp/communicator.h"
#include "models/model.h"
#include "train/report/results.h"

namespace train {

// The counts of one task. Collective (one all-reduce). Runs under no-grad in eval mode (training
// mode is restored) on the model's device. Throws std::invalid_argument when `model` is not a
// language model.
ChoiceCounts evaluate_choice_task(ddp::Communicator& control, models::Model& model,
                                  const data::ChoiceTask& task);

// "NAME: acc A/N (P%), acc_norm B/N (Q%)": the line the log prints.
std::string choice_line(const ChoiceCounts& c);

}  // namespace train
