#include "data/dataset.h"

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

std::string packing_line(const PackingStats& s) {
  const double positions = std::max<double>(1.0, static_cast<double>(s.windows * s.context));
  std::string line = fmt::format(
      "data.packing: {}: {} windows of {} positions: tokens {:.1f}%, targets {:.1f}% of the "
      "positions",
      kPackingNames[static_cast<size_t>(s.packing)], s.windows, s.context,
      100.0 * static_cast<double>(s.tokens) / positions,
      100.0 * static_cast<double>(s.targets) / positions);
  if (s.documents > 0) line += fmt::format("; {} documents", s.documents);
  if (s.split_documents > 0) {
    line += fmt::format(", {} of them longer than data.context, split into {} pieces",
                        s.split_documents, s.pieces);
  }
  return line;
}

std::unique_ptr<Dataset> make_dataset(const DataOptions& options) {
  if (options.dataset == "synthetic") return std::make_unique<SyntheticClassification>(options);
  if (options.dataset == "movielens") return std::make_unique<MovieLensDataset>(options);
  if (options.dataset == "tokens") return make_token_dataset(options);
  if (options.dataset == "csv") return make_csv_dataset(options);
  if (options.dataset == "images") return make_image_dataset(options);
  throw std::invalid_argument(fmt::format("unknown dataset '{}'; known datasets: {}",
                                          options.dataset, fmt::join(dataset_names(), ", ")));
}

}  // namespace data
