// --evaluate without data: a language model's eval.tasks scored where there is no data set to
// validate on (HellaSwag on imported GPT-2 weights, docs/language-models.md). Start-up
// (launcher/startup.h) builds no data set and no Trainer then; the validation loss (and bits per
// byte) is skipped, and the log says so and why.
//
// Without data, the model registry's core::Shape (what a model must know of its data) comes from
// the config's keys for the token ids the model reads: data.vocab_size and data.context, as
// --generate and --export-hf build their model (launcher/generate_command.h). The model's own
// sources then fill its positions as in training (model.context, else model.init_from's, else
// data.context); a vocabulary that differs from model.init_from's weights or from the checkpoint
// evaluated stops the run naming data.vocab_size (exit 2). Training, and --evaluate without
// eval.tasks, still need data.path.
#pragma once

#include <string>

#include "launcher/no_data.h"
#include "launcher/startup.h"

namespace launcher {

// --evaluate without data, on every rank: rank 0 logs that the validation loss is skipped and
// why, then every task of eval.tasks is scored (one all-reduce each) and logged as a run logs it
// ("eval step N: NAME: acc ..."; N: the checkpoint's steps, 0 without one); then the shutdown
// barrier. Collective.
int evaluate_tasks_only(Startup& s);

}  // namespace launcher
