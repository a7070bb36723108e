#include "train/choice_evaluation.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "models/capabilities.h"
#include "models/language_model.h"
#include "train/eval_slice.h"

namespace train {
namespace {

// (acc, acc_norm) of one example: 1 where the ending chosen by the summed (mean) loss is the
// label. All endings go through the model as one batch, padded at the end (a causal model's
// earlier positions do not see the padding).
std::pair<int, int> score_example(models::LanguageModel& lm, const data::ChoiceExample& e,
                                  c10::Device device) {
  const auto endings = static_cast<int64_t>(e.endings.size());
  const auto ctx = static_cast<int64_t>(e.context.size());
  int64_t longest = 0;
  for (const auto& ending : e.endings) {
    longest = std::max<int64_t>(longest, ctx + static_cast<int64_t>(ending.size()) - 1);
  }
  at::Tensor inputs = at::zeros({endings, longest}, at::kLong);
  at::Tensor targets = at::zeros({endings, longest}, at::kLong);
  at::Tensor mask = at::zeros({endings, longest}, at::kDouble);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = targets.accessor<int64_t, 2>();
  auto m = mask.accessor<double, 2>();
  for (int64_t k = 0; k < endings; ++k) {
    std::vector<int64_t> seq = e.context;
    seq.insert(seq.end(), e.endings[k].begin(), e.endings[k].end());
    for (size_t t = 0; t + 1 < seq.size(); ++t) {
      in[k][t] = seq[t];
      out[k][t] = seq[t + 1];
      m[k][t] = t + 1 >= e.context.size() ? 1.0 : 0.0;  // the target is an ending's token
    }
  }
  const at::Tensor logits =
      lm.forward(inputs.to(device)).narrow(-1, 0, lm.vocab_size()).to(at::kFloat);
  const at::Tensor losses =
      at::cross_entropy_loss(logits.reshape({-1, lm.vocab_size()}),
                             targets.reshape({-1}).to(device), {}, at::Reduction::None)
          .reshape({endings, longest})
          .to(at::kCPU, at::kDouble);
  const at::Tensor sums = (losses * mask).sum(1);
  const at::Tensor means = sums / mask.sum(1);
  return {sums.argmin().item<int64_t>() == e.label ? 1 : 0,
          means.argmin().item<int64_t>() == e.label ? 1 : 0};
}

}  // namespace

ChoiceCounts evaluate_choice_task(ddp::Communicator& control, models::Model& model,
                                  const data::ChoiceTask& task) {
  auto* lm = models::as<models::LanguageModel>(model);
  if (lm == nullptr) {
    throw std::invalid_argument(
        fmt::format("eval.tasks: {} needs a language model (gpt, llama or its kin)", task.path));
  }
  const auto n = static_cast<int64_t>(task.examples.size());
  const auto [begin, count] = eval_slice(n, control.size(), control.rank());
  const c10::Device device = model_device(model);

  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  int64_t acc = 0, acc_norm = 0;
  for (int64_t i = begin; i < begin + count; ++i) {
    const auto [a, b] = score_example(*lm, task.examples[static_cast<size_t>(i)], device);
    acc += a;
    acc_norm += b;
  }
  if (was_training) model.train();
  // Doubles hold these integers exactly (below 2^53).
  at::Tensor sums = at::tensor(
      {static_cast<double>(acc), static_cast<double>(acc_norm), static_cast<double>(count)},
      at::kDouble);
  settle_units(model);  // ddp.shard: parameters in step
  control.all_reduce(sums, ddp::ReduceOp::kSum, "choice evaluation");
  ChoiceCounts c;
  c.name = task.name;
  c.acc = static_cast<int64_t>(sums[0].item<double>());
  c.acc_norm = static_cast<int64_t>(sums[1].item<double>());
  c.examples = static_cast<int64_t>(sums[2].item<double>());
  return c;
}

std::string choice_line(const ChoiceCounts& c) {
  const double n = std::max<double>(1.0, static_cast<double>(c.examples));
  return fmt::format("{}: acc {}/{} ({:.1f}%), acc_norm {}/{} ({:.1f}%)", c.name, c.acc, c.examples,
                     100.0 * static_cast<double>(c.acc) / n, c.acc_norm, c.examples,
                     100.0 * static_cast<double>(c.acc_norm) / n);
}

}  // namespace train
