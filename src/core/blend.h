// Blending sources by weight, as nanotron's Nanoset builds its index: the next sample goes to the
// source whose count falls furthest below its share, weight x (samples so far + 1), the first on
// ties. Every prefix of such a sequence holds each source within one sample of its share. The
// rule behind a mixture's training order (ddp/mixture_order.h) and its blended validation
// (data/mixture.h).
#pragma once

#include <cstdint>
#include <vector>

namespace core {

// The source of sample `i` (from 0) given the samples `counts` each has so far, among those
// `open` (all when empty); weights.size() when none is open.
inline size_t most_behind(const std::vector<double>& weights, const std::vector<int64_t>& counts,
                          int64_t i, const std::vector<bool>& open = {}) {
  size_t best = weights.size();
  double deficit = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!open.empty() && !open[k]) continue;
    const double d = weights[k] * double(i + 1) - double(counts[k]);
    if (best == weights.size() || d > deficit) {
      best = k;
      deficit = d;
    }
  }
  return best;
}

}  // namespace core
