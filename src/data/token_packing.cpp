#include "data/token_packing.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>

namespace data {

std::vector<Piece> split_documents(const std::vector<Piece>& documents, int64_t context) {
  if (context < 2) throw std::invalid_argument("split_documents: context must be at least 2");
  std::vector<Piece> out;
  out.reserve(documents.size());
  for (const Piece& d : documents) {
    const int64_t end = d.begin + d.length;
    for (int64_t begin = d.begin;;) {
      const int64_t length = std::min(context, end - begin);
      out.push_back({begin, length, d.shard});
      if (begin + length == end) break;
      begin += length - 1;  // the next piece begins with this one's last token
    }
  }
  return out;
}

PackedWindows pack_best_fit(const std::vector<Piece>& pieces, int64_t context) {
  const auto n = static_cast<int64_t>(pieces.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return pieces[static_cast<size_t>(a)].length > pieces[static_cast<size_t>(b)].length;
  });
  // Open windows by (room left, window): lower_bound({length, 0}) is the best fit, the earliest
  // window among equals.
  std::set<std::pair<int64_t, int64_t>> open;
  std::vector<int64_t> window_of(static_cast<size_t>(n));
  int64_t windows = 0;
  for (const int64_t p : order) {
    const int64_t length = pieces[static_cast<size_t>(p)].length;
    auto it = open.lower_bound({length, 0});
    int64_t w = 0, room = 0;
    if (it == open.end()) {
      w = windows++;
      room = context;
    } else {
      std::tie(room, w) = *it;
      open.erase(it);
    }
    window_of[static_cast<size_t>(p)] = w;
    if (room - length > 0) open.insert({room - length, w});
  }
  PackedWindows out;
  out.first.assign(static_cast<size_t>(windows) + 1, 0);
  for (const int64_t w : window_of) ++out.first[static_cast<size_t>(w) + 1];
  std::partial_sum(out.first.begin(), out.first.end(), out.first.begin());
  std::vector<int64_t> next(out.first.begin(), out.first.end() - 1);
  out.pieces.resize(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {  // document order within each window
    const auto w = static_cast<size_t>(window_of[static_cast<size_t>(p)]);
    out.pieces[static_cast<size_t>(next[w]++)] = pieces[static_cast<size_t>(p)];
  }
  return out;
}

}  // namespace data
