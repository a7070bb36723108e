#include "models/lm/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace models {
namespace {

// Puts the model in eval mode for its lifetime, then back into the mode it found.
class EvalScope {
 public:
  explicit EvalScope(LanguageModel& model) : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~EvalScope() { model_.train(was_training_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  LanguageModel& model_;
  bool was_training_;
};

// The next id from the logits [vocab] (float32, CPU) of the last position.
int64_t pick(at::Tensor logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature == 0.0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    const at::Tensor kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(at::softmax(logits, 0), 1, false, gen).item<int64_t>();
}

}  // namespace

std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& o) {
  const int64_t context = model.context(), vocab = model.vocab_size();
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
  if (static_cast<int64_t>(prompt.size()) >= context) {
    throw std::invalid_argument(fmt::format(
        "generate: the prompt has {} tokens and fills model.context = {}: nothing can follow it",
        prompt.size(), context));
  }
  for (const int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      throw std::invalid_argument(
          fmt::format("generate: prompt id {} is not below the vocabulary ({})", id, vocab));
    }
  }
  if (o.max_new_tokens < 0 || !(o.temperature >= 0.0) || o.top_k < 0) {
    throw std::invalid_argument(fmt::format(
        "generate: max new tokens ({}), temperature ({}) and top-k ({}) must not be negative",
        o.max_new_tokens, o.temperature, o.top_k));
  }
  at::NoGradGuard no_grad;
  EvalScope eval(model);
  const auto on = model.parameters().at(0).options().dtype(at::kLong);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const int64_t room = context - static_cast<int64_t>(prompt.size());
  const int64_t budget = std::min(o.max_new_tokens, room);

  std::vector<int64_t> sequence = prompt, out;
  KvCache cache;
  for (int64_t i = 0; i < budget; ++i) {
    at::Tensor logits;
    if (o.use_cache) {
      // The prompt once, then each new id alone.
      const std::vector<int64_t> feed = i == 0 ? prompt : std::vector<int64_t>{sequence.back()};
      logits = model.forward_cached(at::tensor(feed, on).view({1, -1}), cache);
    } else {
      logits = model.forward(at::tensor(sequence, on).view({1, -1}));
    }
    const at::Tensor last = logits[0][-1].narrow(0, 0, vocab).to(at::kCPU, at::kFloat);
    const int64_t next = pick(last, o, gen);
    out.push_back(next);
    sequence.push_back(next);
    if ((o.stop_id && next == *o.stop_id) ||
        std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      break;
    }
  }
  return out;
}

int64_t generation_context(const Model& model) {
  const auto* lm = dynamic_cast<const LanguageModel*>(&model);
  return lm != nullptr ? lm->context() : 0;
}

std::vector<int64_t> generate(Model& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options) {
  auto* lm = dynamic_cast<LanguageModel*>(&model);
  if (lm == nullptr) throw std::invalid_argument("generate: this model does not generate text");
  return generate(*lm, prompt, options);
}

}  // namespace models
