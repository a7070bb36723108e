#include "train/evaluation.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include "core/shape.h"  // kIgnoreTarget
#include "models/capabilities.h"
#include "models/language_model.h"
#include "train/choice_evaluation.h"
#include "train/eval_slice.h"

namespace train {
namespace {

// Scores held per chunk of users: [chunk, num_items] floats, about 16 MiB.
constexpr int64_t kScoresPerChunk = int64_t(1) << 22;

// (hits, ndcg sum) of `ranks`, as a double [2] tensor on the CPU.
at::Tensor metric_sums(const at::Tensor& ranks, int64_t k) {
  if (k < 1) throw std::invalid_argument(fmt::format("ranking metrics: k must be >= 1, got {}", k));
  const at::Tensor r = ranks.reshape({-1}).to(at::kDouble);
  const at::Tensor hit = r.lt(static_cast<double>(k));
  const at::Tensor gain = at::where(hit, 1.0 / at::log2(r + 2.0), at::zeros_like(r));
  return at::stack({hit.to(at::kDouble).sum(), gain.sum()}).to(at::kCPU);
}

}  // namespace

RankingMetrics ranking_metrics_from_ranks(const at::Tensor& ranks, int64_t k) {
  const at::Tensor sums = metric_sums(ranks, k);
  RankingMetrics m;
  m.users = ranks.numel();
  if (m.users > 0) {
    m.hit_rate = sums[0].item<double>() / static_cast<double>(m.users);
    m.ndcg = sums[1].item<double>() / static_cast<double>(m.users);
  }
  return m;
}

at::Tensor held_out_ranks(const at::Tensor& scores, const at::Tensor& held_items,
                          const at::Tensor& seen_rows, const at::Tensor& seen_items) {
  const auto device = scores.device();
  // The held-out item's own score, before masking: it competes even if the user also has it in
  // training (a repeated rating).
  const at::Tensor target = scores.gather(1, held_items.to(device).to(at::kLong).view({-1, 1}));
  at::Tensor masked = scores.clone();
  if (seen_rows.numel() > 0) {
    masked.index_put_({seen_rows.to(device).to(at::kLong), seen_items.to(device).to(at::kLong)},
                      -std::numeric_limits<float>::infinity());
  }
  return masked.gt(target).sum(1);
}

namespace {

// evaluate_ranking for a task the dataset gave: collective (one all-reduce) whenever `model`
// scores items.
RankingMetrics evaluate_task(ddp::Communicator& control, models::Model& model,
                             const data::RankingTask& task, int64_t k) {
  auto* scorer = models::as<models::ItemScorer>(model);
  if (scorer == nullptr) return {};
  if (k < 1) throw std::invalid_argument(fmt::format("ranking metrics: k must be >= 1, got {}", k));
  at::NoGradGuard no_grad;

  // This rank's contiguous slice of the held-out users (BatchPlan's rule, empty slices allowed).
  const at::Tensor& held = task.held_out;  // [n, 2] (user, item), one row per user
  const int64_t n = held.size(0);
  const auto [begin, count] = eval_slice(n, control.size(), control.rank());

  const c10::Device device = model_device(model);
  const at::Tensor& interactions = task.seen;  // [m, 2] (user, item), CPU
  const at::Tensor inter_users = interactions.select(1, 0).contiguous();
  const at::Tensor inter_items = interactions.select(1, 1).contiguous();
  at::Tensor row_of_user = at::full({task.num_users}, -1, at::kLong);  // chunk row, or -1

  const int64_t chunk =
      std::max<int64_t>(1, kScoresPerChunk / std::max<int64_t>(1, task.num_items));
  at::Tensor sums = at::zeros({3}, at::kDouble);  // hits, ndcg, users
  for (int64_t start = begin; start < begin + count; start += chunk) {
    const int64_t rows = std::min(chunk, begin + count - start);
    const at::Tensor slice = held.narrow(0, start, rows);
    const at::Tensor users = slice.select(1, 0).contiguous();
    const at::Tensor items = slice.select(1, 1).contiguous();
    row_of_user.index_put_({users}, at::arange(rows, at::kLong));
    const at::Tensor row = row_of_user.index_select(0, inter_users);
    const at::Tensor seen = row.ge(0);
    const at::Tensor seen_rows = row.masked_select(seen);
    const at::Tensor seen_items = inter_items.masked_select(seen);
    row_of_user.index_put_({users}, -1);

    const at::Tensor scores = scorer->score_all(users.to(device));
    const at::Tensor ranks = held_out_ranks(scores, items, seen_rows, seen_items);
    sums.narrow(0, 0, 2).add_(metric_sums(ranks, k));
    sums[2] += static_cast<double>(rows);
  }
  settle_units(model);  // ddp.shard: parameters in step
  control.all_reduce(sums, ddp::ReduceOp::kSum, "ranking evaluation");
  RankingMetrics m;
  m.users = static_cast<int64_t>(sums[2].item<double>());
  if (m.users > 0) {
    m.hit_rate = sums[0].item<double>() / static_cast<double>(m.users);
    m.ndcg = sums[1].item<double>() / static_cast<double>(m.users);
  }
  return m;
}

}  // namespace

RankingMetrics evaluate_ranking(ddp::Communicator& control, models::Model& model,
                                const data::Dataset& dataset, int64_t k) {
  const std::optional<data::RankingTask> task = dataset.ranking_task();
  return task ? evaluate_task(control, model, *task, k) : RankingMetrics{};
}

namespace {

// Logits held at once by bits per byte's forward passes: 2^26 floats (256 MiB) per chunk of rows,
// as forward() gives whole [rows, positions, vocabulary] logits (GPT-2's vocabulary at 1024
// positions: 200 MiB a row).
constexpr int64_t kLogitsPerChunk = int64_t(1) << 26;

// (nats, bytes) of the next-token loss over `targets` [n, t] (bits per byte's sums; evaluation.h),
// in chunks of rows; `positions`: a packed batch's (undefined otherwise). Targets the loss skips
// (core::kIgnoreTarget, cross_entropy's default ignore_index) count no nats and no bytes.
std::pair<double, double> nats_and_bytes(models::LanguageModel& lm, const at::Tensor& inputs,
                                         const at::Tensor& targets, const at::Tensor& positions,
                                         const at::Tensor& token_bytes) {
  const int64_t vocab = lm.vocab_size(), n = inputs.size(0);
  const int64_t rows = std::max<int64_t>(1, kLogitsPerChunk / (inputs.size(1) * vocab));
  double nats = 0;
  for (int64_t start = 0; start < n; start += rows) {
    const int64_t r = std::min(rows, n - start);
    const at::Tensor in = inputs.narrow(0, start, r);
    const at::Tensor logits = (positions.defined() ? models::packed_documents(lm).forward_packed(
                                                         in, positions.narrow(0, start, r))
                                                   : lm.forward(in))
                                  .narrow(-1, 0, vocab);
    nats +=
        at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, vocab}),
                               targets.narrow(0, start, r).reshape({-1}), {}, at::Reduction::Sum)
            .item<double>();
  }
  const at::Tensor flat = targets.reshape({-1}).to(at::kCPU);
  const at::Tensor counted = flat.ne(core::kIgnoreTarget);
  const at::Tensor bytes =
      token_bytes.index_select(0, at::where(counted, flat, 0)).mul(counted).sum();
  return {nats, static_cast<double>(bytes.item<int64_t>())};
}

}  // namespace

namespace {

// One validation batch's sums (`inputs`, `targets`: `b`'s on the model's device): the objective's
// (null: the model's eval_sums).
std::vector<std::pair<std::string, at::Tensor>> batch_sums(models::Model& model,
                                                           const Objective* objective,
                                                           const data::Batch& b,
                                                           const at::Tensor& inputs,
                                                           const at::Tensor& targets) {
  if (objective == nullptr) return models::eval_sums_of(model, inputs, targets, b.positions);
  const at::Tensor pairs = b.pairs.defined() ? b.pairs.to(inputs.device()) : at::Tensor();
  return objective->eval_sums({inputs, targets, b.positions, pairs});
}

// The means of evaluate_validation's summed `sums` (`names`' sums, then with `bpb` nats and
// bytes, then the targets and the samples).
ValidationMetrics means_of(const at::Tensor& sums, const std::vector<std::string>& names,
                           bool bpb) {
  ValidationMetrics m;
  m.samples = static_cast<int64_t>(sums[-1].item<double>());
  const double targets = sums[-2].item<double>();
  for (size_t i = 0; i < names.size(); ++i) {
    // The loss per target (Model::eval_sums), every other metric per sample.
    const double count = names[i] == "loss" ? targets : static_cast<double>(m.samples);
    m.means.emplace_back(names[i],
                         sums[static_cast<int64_t>(i)].item<double>() / std::max(1.0, count));
  }
  if (bpb && sums[-3].item<double>() > 0) {
    m.means.emplace_back("bpb",
                         sums[-4].item<double>() / (std::log(2.0) * sums[-3].item<double>()));
  }
  return m;
}

}  // namespace

ValidationMetrics evaluate_validation(ddp::Communicator& control, models::Model& model,
                                      const data::Dataset& validation, int64_t batch,
                                      int64_t max_samples, const at::Tensor& token_bytes,
                                      const Objective* objective) {
  const int64_t n = max_samples > 0 ? std::min(max_samples, validation.size()) : validation.size();
  const auto [begin, count] = eval_slice(n, control.size(), control.rank());
  const c10::Device device = model_device(model);
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  // The metric names come from the model; a rank with no samples still learns them (from one
  // sample, weighted 0) so that every rank reduces the same vector.
  // sums: the eval_sums, then (bits per byte) nats and bytes, then the targets the loss counts
  // (Dataset::target_count) and the samples.
  const bool pairs = objective != nullptr && objective->preference();
  auto* lm = token_bytes.defined() && !pairs ? models::as<models::LanguageModel>(model) : nullptr;
  std::vector<std::string> names;
  at::Tensor sums;
  auto add = [&](int64_t start, int64_t rows, double weight) {
    const at::Tensor indices = at::arange(start, start + rows, at::kLong);
    const data::Batch b = validation.get(indices);
    const at::Tensor inputs = b.inputs.to(device), targets = b.targets.to(device);
    // A packed batch's positions stay on the host: the model takes them from there.
    const auto parts = batch_sums(model, objective, b, inputs, targets);
    if (!sums.defined()) {
      for (const auto& [name, value] : parts) names.push_back(name);
      sums = at::zeros({static_cast<int64_t>(names.size()) + (lm ? 4 : 2)}, at::kDouble);
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      sums[static_cast<int64_t>(i)] += parts[i].second.item<double>() * weight;
    }
    if (lm != nullptr) {
      const auto [nats, bytes] = nats_and_bytes(*lm, inputs, targets, b.positions, token_bytes);
      sums[-4] += nats * weight;
      sums[-3] += bytes * weight;
    }
    sums[-2] += static_cast<double>(validation.target_count(indices)) * weight;
    sums[-1] += static_cast<double>(rows) * weight;
  };
  if (count == 0 && n > 0) add(0, 1, 0.0);
  for (int64_t start = begin; start < begin + count; start += std::max<int64_t>(1, batch)) {
    add(start, std::min(std::max<int64_t>(1, batch), begin + count - start), 1.0);
  }
  if (was_training) model.train();
  if (!sums.defined()) return {};  // an empty split: every rank sees n = 0, nobody communicates
  settle_units(model);             // ddp.shard: parameters in step
  control.all_reduce(sums, ddp::ReduceOp::kSum, "validation evaluation");
  return means_of(sums, names, lm != nullptr);
}

namespace {

std::string means_text(const ValidationMetrics& m) {
  std::string text;
  for (const auto& [name, value] : m.means) text += fmt::format("{} {:.4f} ", name, value);
  return text;
}

// A mixture's sources apart (data.mixture): each one's validation split, its means into `m` as
// "NAME/loss", "NAME/bpb", ...; one all-reduce per source that has a split, in data.mixture's
// order, on every rank.
void evaluate_sources(ddp::Communicator& control, models::Model& model,
                      const data::Dataset& dataset, int64_t step, int64_t batch,
                      int64_t max_samples, const EvalInputs& inputs, ValidationMetrics& m) {
  for (const data::SourceInfo& source : dataset.sources()) {
    if (source.validation == nullptr) continue;
    const ValidationMetrics one =
        evaluate_validation(control, model, *source.validation, batch, max_samples,
                            inputs.token_bytes, inputs.objective);
    if (control.rank() == 0 && one.samples > 0) {
      spdlog::info("eval step {}: {}: {}over {} validation samples", step, source.name,
                   means_text(one), one.samples);
    }
    for (const auto& [name, value] : one.means)
      m.means.emplace_back(source.name + "/" + name, value);
  }
}

ValidationMetrics evaluate_dataset(ddp::Communicator& control, models::Model& model,
                                   const data::Dataset& dataset, int64_t step, int64_t batch,
                                   int64_t max_samples, const EvalInputs& inputs) {
  if (const std::optional<data::RankingTask> task = dataset.ranking_task()) {
    constexpr int64_t k = 10;
    const RankingMetrics m = evaluate_task(control, model, *task, k);
    if (control.rank() == 0 && m.users > 0) {
      // A uniformly random ranking's HR@k, roughly (it ignores the masked training items).
      const double random =
          std::min(1.0, static_cast<double>(k) / static_cast<double>(task->num_items));
      spdlog::info("eval step {}: HR@{} {:.3f} NDCG@{} {:.3f} over {} users (random: {:.3f})", step,
                   k, m.hit_rate, k, m.ndcg, m.users, random);
    }
    ValidationMetrics out;
    if (m.users > 0) out = {{{"hr@10", m.hit_rate}, {"ndcg@10", m.ndcg}}, m.users, {}};
    return out;
  }
  const auto validation = dataset.validation();
  if (!validation) return {};
  ValidationMetrics m = evaluate_validation(control, model, *validation, batch, max_samples,
                                            inputs.token_bytes, inputs.objective);
  if (control.rank() == 0 && m.samples > 0) {
    spdlog::info("eval step {}: {}over {} validation samples{}", step, means_text(m), m.samples,
                 dataset.sources().empty() ? "" : " (the sources blended by weight)");
  }
  evaluate_sources(control, model, dataset, step, batch, max_samples, inputs, m);
  return m;
}

}  // namespace

ValidationMetrics evaluate_and_log(ddp::Communicator& control, models::Model& model,
                                   const data::Dataset& dataset, int64_t step, int64_t batch,
                                   int64_t max_samples, const EvalInputs& inputs) {
  ValidationMetrics m = evaluate_dataset(control, model, dataset, step, batch, max_samples, inputs);
  for (const data::ChoiceTask& task : inputs.tasks) {
    m.tasks.push_back(evaluate_choice_task(control, model, task));
    if (control.rank() == 0) spdlog::info("eval step {}: {}", step, choice_line(m.tasks.back()));
  }
  return m;
}

}  // namespace train
