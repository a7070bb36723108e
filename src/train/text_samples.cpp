#include "train/text_samples.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "models/lm/generate.h"

namespace train {
namespace {

constexpr int64_t kSamplePromptTokens = 16;  // train.sample_prompt empty: from the data

// The first kSamplePromptTokens ids of the first validation sequence, else training sequence.
std::vector<int64_t> prompt_from_data(const data::Dataset& dataset) {
  const auto val = dataset.validation();
  const data::Dataset& from = val && val->size() > 0 ? *val : dataset;
  const at::Tensor rows = from.get(at::zeros({1}, at::kLong)).inputs;
  // A preference pair's first row is its chosen sequence.
  const at::Tensor first = rows.reshape({-1, rows.size(-1)})[0];
  const int64_t n = std::min<int64_t>(kSamplePromptTokens, first.size(0));
  const at::Tensor head = first.narrow(0, 0, n).to(at::kLong).contiguous();
  return {head.data_ptr<int64_t>(), head.data_ptr<int64_t>() + n};
}

}  // namespace

std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::function<std::string()> make_text_sampler(std::shared_ptr<models::Model> model,
                                               const std::string& model_name,
                                               std::shared_ptr<const data::Tokenizer> tokenizer,
                                               const TrainOptions& options,
                                               const data::Dataset& dataset) {
  const int64_t context = models::generation_context(*model);
  if (context == 0) {
    throw std::invalid_argument(fmt::format(
        "train.sample_every: samples need a language model (model.name: gpt or llama), not {}",
        model_name));
  }
  std::vector<int64_t> prompt = tokenizer->encode(options.sample_prompt);
  if (prompt.empty()) prompt = prompt_from_data(dataset);
  models::SamplingOptions o;
  o.max_new_tokens = options.sample_tokens;
  o.temperature = options.sample_temperature;
  o.top_k = options.sample_top_k;
  o.seed = options.seed;
  o.stop_id = tokenizer->end_of_text();
  // Checked now: a prompt that fills the context is a config mistake, not a failure at step N.
  if (static_cast<int64_t>(prompt.size()) >= context) {
    throw std::invalid_argument(fmt::format(
        "train.sample_prompt: {} tokens fill model.context = {}", prompt.size(), context));
  }
  return [model, tokenizer, prompt, o] {
    const auto ids = models::generate(*model, prompt, o);
    return one_line(tokenizer->decode(prompt) + " | " +
                    data::decode_continuation(*tokenizer, prompt, ids));
  };
}

PeriodicAction text_sample_action(int64_t every, std::function<std::string()> sample,
                                  std::function<std::unique_ptr<LockstepUnits>()> units) {
  return {"text sample",
          "samples",
          {.every = every},
          [sample = std::move(sample), units = std::move(units)](int64_t step) {
            const std::unique_ptr<LockstepUnits> in_step = units ? units() : nullptr;
            if (sample) spdlog::info("sample at step {}: {}", step, sample());
            if (in_step) in_step->finish();
          }};
}

}  // namespace train
