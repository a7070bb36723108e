// Objective: what a micro-batch's loss is (train.objective; docs/DESIGN.md, "Preference
// objectives"). The training step, the memory probe and evaluation all ask it, so an objective is
// one mechanism and not a case in each.
//
//   lm     the model's loss (models::loss_of): next-token cross-entropy, a mean over the targets.
//   dpo    Direct Preference Optimization over pairs (data/token_shards.h: a sample is a pair,
//          inputs [n, 2, T]). The chosen and rejected rows go through one forward, concatenated
//          along the batch ([2n, T]: chosen first); logp(y) is the sequence's summed
//          log-probability of its completion (models::SequenceLogProbs). With
//          h = (logp_c - logp_r) - (ref_c - ref_r), the pair's loss is
//            -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h)
//          (e = train.dpo_label_smoothing: 0 is the paper's sigmoid loss, above 0 cDPO's robust
//          form as TRL computes it); rewards beta (logp - ref).
//   simpo  SimPO: the log-probabilities normalised by the completion's length (its targets), no
//          reference; loss -log sigmoid(beta (avg_c - avg_r) - gamma), rewards beta avg.
// A micro-batch's loss is the mean over its pairs; the trainer weighs it by its pairs over the
// global batch's (Dataset::target_count counts one per pair), so the step's loss is the mean over
// the global batch's pairs, whatever the ranks and micro-batches.
//
// The reference (dpo): under LoRA the model itself with its adapters switched off
// (models::AdaptersOff) under no-grad, in the same micro-batch; without adapters (full
// fine-tuning) a table of the initial weights' log-probabilities per pair, computed once before
// step 1 (train/reference_logps.h) and looked up by Batch::pairs.
//
// Metrics (TRL's names, kPreferenceMetrics): each micro-batch adds its pairs' sums, scaled by
// the caller, into a float64 vector on the device; nothing is read on the host.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "models/model.h"
#include "train/options.h"

namespace train {

// The preference metrics, as TRL's DPOTrainer and CPOTrainer name them, in the order of the sums.
inline constexpr std::array<const char*, 6> kPreferenceMetrics = {
    "rewards/chosen",  "rewards/rejected", "rewards/accuracies",
    "rewards/margins", "logps/chosen",     "logps/rejected"};

// Where dpo's reference log-probabilities come from.
enum class ReferenceKind { kNone, kAdaptersOff, kPrecomputed };

class Objective {
 public:
  // `model`: the model the loss is of (borrowed). Throws std::invalid_argument naming
  // train.objective when the model cannot score sequences.
  Objective(const TrainOptions& train, models::Model& model);

  ObjectiveKind kind() const { return kind_; }
  const char* name() const { return kObjectiveNames[static_cast<size_t>(kind_)]; }
  bool preference() const { return kind_ != ObjectiveKind::kLm; }
  ReferenceKind reference() const { return reference_; }
  // The model's forwards per micro-batch: 2 with the adapters-off reference, else 1 (the unit
  // gate's order under ddp.shard: parameters, train/model_state.h).
  int forwards() const { return reference_ == ReferenceKind::kAdaptersOff ? 2 : 1; }
  // "the frozen base with the adapters off", ...: what the log says of the reference.
  std::string reference_text() const;
  // The number of metric sums a micro-batch adds (kPreferenceMetrics; 0 for lm).
  int64_t metrics() const {
    return preference() ? static_cast<int64_t>(kPreferenceMetrics.size()) : 0;
  }

  // ReferenceKind::kPrecomputed: the tables (float64 [pairs, 2]: chosen, rejected) of the
  // training and validation splits (undefined: none), on the model's device.
  void set_reference(at::Tensor train, at::Tensor validation);

  // The mean loss of `micro` (on the model's device): lm per target, a preference objective per
  // pair. `sums` (a preference objective; float64 [metrics()] on the device, or null): += each
  // metric's sum over the pairs times `scale`.
  at::Tensor loss(const data::Batch& micro, const at::Tensor* sums = nullptr,
                  double scale = 1.0) const;
  // Evaluation's sums (Model::eval_sums' form): lm the model's; a preference objective "loss"
  // (summed over the pairs) and the metrics' sums, on the validation split's reference.
  std::vector<std::pair<std::string, at::Tensor>> eval_sums(const data::Batch& batch) const;
  // The model's log-probabilities of each pair's completions (float64 [n, 2], no gradient),
  // summed (the reference's kind of number): what the precomputed reference holds.
  at::Tensor pair_logps(const data::Batch& batch) const;

 private:
  struct Pairs;  // one micro-batch's numbers (objective.cpp)
  Pairs pairs(const data::Batch& micro, bool validation) const;

  ObjectiveKind kind_;
  PreferenceOptions options_;
  models::Model& model_;
  ReferenceKind reference_ = ReferenceKind::kNone;
  at::Tensor train_reference_, validation_reference_;
};

}  // namespace train
