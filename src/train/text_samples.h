// train.sample_every's text samples: rank 0 logs a continuation of one fixed prompt every N steps
// (text_sample_action), so that a reader sees what the model has learned so far.
//
// Contract: the prompt, the seed (train.seed), the temperature and top-k are fixed when the
// sampler is made, so samples at different steps differ only by the weights. Sampling runs under
// no-grad in eval mode, puts the training mode back and draws from a generator of its own
// (models/lm/generate.h): the training run is the same, loss for loss, with and without samples.
// The model is reached through the Model interface only (docs/DESIGN.md, "Layers", rule 5).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "models/model.h"
#include "train/options.h"
#include "train/periodic.h"
#include "train/unit_gate.h"

namespace train {

// A sampler returning one line: the prompt's text, " | ", then the text of
// options.sample_tokens new tokens at options.sample_temperature and options.sample_top_k, with
// control characters escaped. The prompt is options.sample_prompt encoded by `tokenizer`, or
// when it is empty the first 16 tokens of the first validation sequence (else training
// sequence) of `dataset`. Throws std::invalid_argument naming train.sample_every for a model that
// does not generate text (`model_name`, model.name, is named too), and train.sample_prompt for a
// prompt that fills the model's context.
std::function<std::string()> make_text_sampler(std::shared_ptr<models::Model> model,
                                               const std::string& model_name,
                                               std::shared_ptr<const data::Tokenizer> tokenizer,
                                               const TrainOptions& options,
                                               const data::Dataset& dataset);

// train.sample_every: the periodic action that logs "sample at step S: TEXT" after every
// `every`-th step (timed as "samples"). `sample` must leave the training state alone
// (models/lm/generate.h: eval mode, its own generator). Every rank registers it: rank 0 with its
// sampler, the others with none. Where `units` gives a handle (ddp.shard: parameters:
// Trainer::units_in_step) the action is collective: rank 0 generates while the others gather the
// units with it, one at a time, and the handle's finish() ends that on every rank; otherwise
// only rank 0 does anything, and communicates nothing.
PeriodicAction text_sample_action(int64_t every, std::function<std::string()> sample,
                                  std::function<std::unique_ptr<LockstepUnits>()> units = {});

// `text` on one line of a log: newlines, backslashes and control characters escaped.
std::string one_line(const std::string& text);

}  // namespace train
