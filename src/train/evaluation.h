// Evaluation on held-out data, through the Dataset and Model interfaces only (this file names no
// concrete dataset or model):
//
// Ranking (data with a data::RankingTask, e.g. leave-last-out interactions, and a model that
// scores items, Model::score_all): for each held-out (user, item) pair every item is scored; the
// items the user has in training are masked out (score -inf; the held-out item itself always
// competes), and the held-out item's rank is the number of remaining items that score strictly
// higher (0: best).
//   HR@k   = mean over users of [rank < k]
//   NDCG@k = mean over users of [rank < k] / log2(rank + 2)      (one relevant item: IDCG = 1)
//
// Validation (data with a validation split): the means of the model's eval_sums.
//
// Distributed: rank r of W evaluates a contiguous slice of the held-out users or validation
// samples (the same rule as the batch plan: n / W each, the first n mod W ranks one more), and one
// SUM all-reduce on the control communicator gives every rank the same global metrics. Every rank
// issues exactly that one collective, whatever its slice (even an empty one), so the result does
// not depend on W beyond float rounding of the sums.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/choice_tasks.h"
#include "data/dataset.h"
#include "ddp/communicator.h"
#include "models/model.h"
#include "train/objective.h"
#include "train/report/results.h"

namespace train {

// What evaluation reads besides the dataset, the same on every rank: the multiple-choice tasks of
// eval.tasks (train/choice_evaluation.h) and, for bits per byte, the bytes each token id stands
// for.
struct EvalInputs {
  std::vector<data::ChoiceTask> tasks;
  // int64 [vocabulary] on the CPU: the bytes of each id's decoded text (byte-level data: all 1);
  // undefined: no bits per byte (data without a tokenizer).
  at::Tensor token_bytes;
  // train.objective (the trainer's): validation's sums are its eval_sums; null: the model's.
  const Objective* objective = nullptr;
};

struct RankingMetrics {
  double hit_rate = 0;  // HR@k, in [0, 1]
  double ndcg = 0;      // NDCG@k, in [0, 1]
  int64_t users = 0;    // held-out users evaluated (0: nothing to evaluate)
};

// The metrics of held-out items ranked `ranks` (int64 [n], 0-based, any device). Pure; n = 0 gives
// zeros. Throws std::invalid_argument for k < 1.
RankingMetrics ranking_metrics_from_ranks(const at::Tensor& ranks, int64_t k);

// The rank of each row's held-out item: scores float [u, num_items]; held_items int64 [u] (the
// held-out item of each row); seen_rows, seen_items int64 [m]: the (row, item) pairs to mask (the
// rows' training items). Counts, per row, the items other than masked ones scoring strictly above
// the held-out item. Pure: `scores` is not modified. Returns int64 [u] on the scores' device.
at::Tensor held_out_ranks(const at::Tensor& scores, const at::Tensor& held_items,
                          const at::Tensor& seen_rows, const at::Tensor& seen_items);

// HR@k and NDCG@k over every held-out user of `dataset`'s ranking task, the same on every rank.
// Collective on `control` (one all-reduce) when `dataset` has a ranking task and `model` scores
// items (Model::scores_items); otherwise returns users = 0 without communicating (the dataset and
// model are the same kinds on every rank, so ranks still agree). Runs under no-grad on the model's
// device, in chunks of users.
RankingMetrics evaluate_ranking(ddp::Communicator& control, models::Model& model,
                                const data::Dataset& dataset, int64_t k);

// The mean of each of the model's eval_sums (Model::eval_sums: "loss", and e.g. "psnr") over the
// first `max_samples` samples of `validation` (0: all of them), in that order, as a
// ValidationMetrics (train/report/results.h: the reporting layer records it): "loss" per target
// (Dataset::target_count: the target tokens the loss counts, on token data), the others per
// sample. Packed batches (Batch::positions) go through models::eval_sums_of.
// Rank r of W evaluates a contiguous slice of those samples (the batch plan's rule), in chunks of
// at most `batch`, under no-grad in eval mode (training mode is restored), on the model's device;
// one SUM all-reduce on `control` of (sums..., targets, samples) gives every rank the same means.
// Every rank issues exactly that one collective, even with an empty slice. Collective.
// With `token_bytes` defined and a models::LanguageModel, also "bpb", bits per byte: the summed
// next-token loss in nats over every target token evaluated (core::kIgnoreTarget skipped), over
// ln 2 times those tokens' bytes (token_bytes of each target id), so that runs with different
// tokenizers compare. With `objective` (not null) the sums are its eval_sums (a preference
// objective: the loss and kPreferenceMetrics, per pair; no bits per byte).
ValidationMetrics evaluate_validation(ddp::Communicator& control, models::Model& model,
                                      const data::Dataset& validation, int64_t batch,
                                      int64_t max_samples, const at::Tensor& token_bytes = {},
                                      const Objective* objective = nullptr);

// The trainer's evaluation hook. Rank 0 logs
//   "eval step S: HR@10 .. NDCG@10 .. over N users (random: k / num_items)"  (a ranking task), or
//   "eval step S: loss .. psnr .. over N validation samples"    (datasets with a validation split;
//                                                    bpb beside the loss with inputs.token_bytes),
// then one line per task of `inputs`: "eval step S: NAME: acc A/N (P%), acc_norm B/N (Q%)".
// Collective as above, then one all-reduce per task; nothing (and no collective) for datasets with
// neither, or with a ranking task and a model that scores no items. Returns what it logged
// (ranking: "hr@10", "ndcg@10" over `samples` users; the tasks' counts), empty for nothing.
ValidationMetrics evaluate_and_log(ddp::Communicator& control, models::Model& model,
                                   const data::Dataset& dataset, int64_t step, int64_t batch,
                                   int64_t max_samples, const EvalInputs& inputs = {});

}  // namespace train
