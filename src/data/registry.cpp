#include "data/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "data/movielens.h"
#include "data/readers.h"
#include "data/synthetic.h"

namespace data {

std::vector<std::string> dataset_names() {
  return {"csv", "images", "movielens", "synthetic", "tokens"};
}

std::unique_ptr<Dataset> make_dataset(const DataOptions& options) {
  if (options.dataset == "synthetic") return std::make_unique<SyntheticClassification>(options);
  if (options.dataset == "movielens") return std::make_unique<MovieLensDataset>(options);
  if (options.dataset == "tokens") {
    return options.mixture.empty() ? make_token_dataset(options) : make_mixture_dataset(options);
  }
  if (options.dataset == "csv") return make_csv_dataset(options);
  if (options.dataset == "images") return make_image_dataset(options);
  throw std::invalid_argument(fmt::format("unknown dataset '{}'; known datasets: {}",
                                          options.dataset, fmt::join(dataset_names(), ", ")));
}

}  // namespace data
