// MixtureOrder: the order a mixture of sources (data.mixture) is drawn in, as a function of the
// seed, the weights and the position in the run's stream of samples alone (position = step x
// global batch + the sample's place in it), so never of the ranks, micro-batches or loader
// workers (ddp/rank_sampler.h).
// - Which source position p draws from: a blend table of kPeriod positions built once, as
//   nanotron's Nanoset builds its index (core/blend.h: each position to the source furthest
//   below its share), repeated. Every prefix of the table holds each source within one sample of
//   its share, so over any n samples of the run a source's share is within (1 + n / kPeriod) / n
//   of its weight (the table's own rounding adding at most 1 / kPeriod).
// - Which of the source's samples: its c-th draw is sample c mod N of pass c / N (N its
//   samples), each pass a permutation of its own keyed by (seed, source, pass): a Feistel network
//   over [0, N), cycle-walked, computed per sample (nothing held per pass). A source that runs
//   out goes on with a new pass in a new order; first_wrap() says where each first does.
// Pure: every rank computes the same order; at() may be called from any thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ddp {

class MixtureOrder {
 public:
  static constexpr int64_t kPeriod = int64_t(1) << 16;

  // `weights` (positive; normalised here) and `sizes` (samples, positive) per source.
  MixtureOrder(std::vector<double> weights, std::vector<int64_t> sizes, uint64_t seed);

  // The source of stream position `p` (>= 0) and the index of its sample there.
  std::pair<size_t, int64_t> at(int64_t p) const;
  // The position of source k's first sample of its second pass (-1: never, a weight too small to
  // be drawn in kPeriod positions).
  int64_t first_wrap(size_t k) const;
  const std::vector<double>& weights() const { return weights_; }
  // Bytes of the table.
  int64_t bytes() const;

 private:
  std::vector<double> weights_;
  std::vector<int64_t> sizes_;
  uint64_t seed_;
  std::vector<uint32_t> source_;  // per table position
  std::vector<int64_t> rank_;     // per table position: its draw's index among its source's
  std::vector<int64_t> quota_;    // per source: its draws per period
};

// Element `x` of a permutation of [0, n) keyed by `key` (a 4-round Feistel network over the
// smallest even number of bits holding n - 1, cycle-walked into [0, n)).
int64_t keyed_permutation(int64_t x, int64_t n, uint64_t key);

}  // namespace ddp
