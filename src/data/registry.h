// The datasets by name (data.dataset): every reader is listed in registry.cpp, which alone knows
// the concrete types; the rest of the project sees data::Dataset (data/dataset.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace data {

// The dataset names make_dataset knows.
std::vector<std::string> dataset_names();

// Throws std::invalid_argument for an unknown dataset name, and data::DataError (data/errors.h)
// for a file that cannot be read, naming the file and line or byte offset.
std::unique_ptr<Dataset> make_dataset(const DataOptions& options);

}  // namespace data
