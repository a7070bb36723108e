#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>

namespace data {

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

}  // namespace data
