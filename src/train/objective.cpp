#include "train/objective.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "core/shape.h"    // kIgnoreTarget
#include "models/block.h"  // AdaptersOff
#include "models/capabilities.h"

namespace train {

struct Objective::Pairs {
  at::Tensor losses;            // [n], differentiable
  at::Tensor chosen, rejected;  // the policy's logps [n] (simpo: per target), detached
  at::Tensor reward_chosen, reward_rejected;  // [n], detached
};

namespace {

models::SequenceLogProbs& scorer(models::Model& model, ObjectiveKind kind) {
  auto* s = models::as<models::SequenceLogProbs>(model);
  if (s == nullptr) {
    throw std::invalid_argument(
        fmt::format("train.objective: {} scores sequences, which this model cannot (gpt, llama "
                    "and its kin can)",
                    kObjectiveNames[static_cast<size_t>(kind)]));
  }
  return *s;
}

// A pair batch's rows, chosen first then rejected, concatenated along the batch: [2n, T].
at::Tensor rows(const at::Tensor& pairs) {
  return at::cat({pairs.select(1, 0), pairs.select(1, 1)}, 0);
}

bool has_adapters(const models::Model& model) {
  const auto* a = models::as<models::Adapters>(model);
  return a != nullptr && a->has_adapters();
}

}  // namespace

Objective::Objective(const TrainOptions& train, models::Model& model)
    : kind_(train.objective), options_(train.preference), model_(model) {
  if (!preference()) return;
  scorer(model_, kind_);
  if (kind_ == ObjectiveKind::kDpo) {
    reference_ = has_adapters(model_) ? ReferenceKind::kAdaptersOff : ReferenceKind::kPrecomputed;
  }
}

std::string Objective::reference_text() const {
  switch (reference_) {
    case ReferenceKind::kAdaptersOff:
      return "the frozen base with the adapters off (no-grad, in each micro-batch)";
    case ReferenceKind::kPrecomputed:
      return "the initial weights' log-probabilities, computed once before step 1";
    case ReferenceKind::kNone: break;
  }
  return "none";
}

void Objective::set_reference(at::Tensor train, at::Tensor validation) {
  train_reference_ = std::move(train);
  validation_reference_ = std::move(validation);
}

Objective::Pairs Objective::pairs(const data::Batch& micro, bool validation) const {
  const int64_t n = micro.inputs.size(0);
  const at::Tensor inputs = rows(micro.inputs), targets = rows(micro.targets);
  models::SequenceLogProbs& model = scorer(model_, kind_);
  at::Tensor logps = model.sequence_logps(inputs, targets);
  Pairs p;
  if (kind_ == ObjectiveKind::kSimpo) {
    // Length-normalised: the mean log-probability over the completion's targets.
    logps = logps / targets.ne(core::kIgnoreTarget).sum(1).clamp_min(1).to(logps.scalar_type());
    const at::Tensor c = logps.narrow(0, 0, n), r = logps.narrow(0, n, n);
    const double beta = options_.simpo_beta;
    p.losses = -at::log_sigmoid(beta * (c - r) - options_.simpo_gamma);
    p.chosen = c.detach(), p.rejected = r.detach();
    p.reward_chosen = beta * p.chosen, p.reward_rejected = beta * p.rejected;
    return p;
  }
  at::Tensor ref;  // [2n]: chosen then rejected
  if (reference_ == ReferenceKind::kAdaptersOff) {
    const at::NoGradGuard no_grad;
    const models::AdaptersOff off;
    ref = model.sequence_logps(inputs, targets);
  } else {
    const at::Tensor& table = validation ? validation_reference_ : train_reference_;
    if (!table.defined()) {
      throw std::logic_error("train.objective: dpo: no reference log-probabilities were set");
    }
    const at::Tensor looked = table.index_select(0, micro.pairs.to(table.device()));
    ref = rows(looked.unsqueeze(-1)).squeeze(-1).to(logps.scalar_type());
  }
  const at::Tensor c = logps.narrow(0, 0, n), r = logps.narrow(0, n, n);
  const at::Tensor rc = ref.narrow(0, 0, n), rr = ref.narrow(0, n, n);
  const double beta = options_.dpo_beta, e = options_.dpo_label_smoothing;
  const at::Tensor h = (c - r) - (rc - rr);
  p.losses = -at::log_sigmoid(beta * h) * (1 - e);
  if (e > 0) p.losses = p.losses - at::log_sigmoid(-beta * h) * e;
  p.chosen = c.detach(), p.rejected = r.detach();
  p.reward_chosen = beta * (p.chosen - rc), p.reward_rejected = beta * (p.rejected - rr);
  return p;
}

namespace {

// float64 [metrics] on the device: each metric's sum over the pairs (kPreferenceMetrics' order).
at::Tensor metric_sums(const at::Tensor& rc, const at::Tensor& rr, const at::Tensor& c,
                       const at::Tensor& r) {
  return at::stack({rc.sum(), rr.sum(), rc.gt(rr).sum(), (rc - rr).sum(), c.sum(), r.sum()})
      .to(at::kDouble);
}

}  // namespace

at::Tensor Objective::loss(const data::Batch& micro, const at::Tensor* sums, double scale) const {
  if (!preference()) {
    return models::loss_of(model_, micro.inputs, micro.targets, micro.positions);
  }
  const Pairs p = pairs(micro, false);
  if (sums != nullptr) {
    const at::NoGradGuard no_grad;
    sums->add_(metric_sums(p.reward_chosen, p.reward_rejected, p.chosen, p.rejected), scale);
  }
  return p.losses.mean();
}

std::vector<std::pair<std::string, at::Tensor>> Objective::eval_sums(
    const data::Batch& batch) const {
  if (!preference()) {
    return models::eval_sums_of(model_, batch.inputs, batch.targets, batch.positions);
  }
  const Pairs p = pairs(batch, true);
  const at::Tensor m = metric_sums(p.reward_chosen, p.reward_rejected, p.chosen, p.rejected);
  std::vector<std::pair<std::string, at::Tensor>> out = {{"loss", p.losses.sum().to(at::kDouble)}};
  for (size_t i = 0; i < kPreferenceMetrics.size(); ++i) {
    out.emplace_back(kPreferenceMetrics[i], m[static_cast<int64_t>(i)]);
  }
  return out;
}

at::Tensor Objective::pair_logps(const data::Batch& batch) const {
  const at::NoGradGuard no_grad;
  const int64_t n = batch.inputs.size(0);
  const at::Tensor logps =
      scorer(model_, kind_).sequence_logps(rows(batch.inputs), rows(batch.targets));
  return at::stack({logps.narrow(0, 0, n), logps.narrow(0, n, n)}, 1).to(at::kDouble);
}

}  // namespace train
