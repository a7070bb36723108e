// What start-up knows of the data before it has any (--evaluate of eval.tasks without data:
// launcher/evaluate_tasks.h): whether the run has data to validate on, and the shape a language
// model is built from without it. Functions of the configuration and this rank's file system.
#pragma once

#include <string>

#include "config/config.h"
#include "core/shape.h"

namespace launcher {

// Why --evaluate (`evaluating`) with eval.tasks on token data has no data to validate on:
// "data.path is not set", "data.path 'X' does not exist"; "" where it has data, and for every
// other run (whose data.path, if missing, stays the data layer's error). Looks at the file system
// of this rank: start-up has the ranks agree.
std::string missing_validation_data(const config::Config& config, bool evaluating);

// The shape a language model is built from without data: data.vocab_size, data.context.
core::Shape shape_without_data(const config::Config& config);

// What a checkpoint that does not fit a model built without data should add to its error.
std::string without_data_hint(const config::Config& config);

}  // namespace launcher
