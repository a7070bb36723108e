#include "ddp/mixture_order.h"

#include <bit>
#include <numeric>
#include <stdexcept>

#include "core/blend.h"
#include "core/splitmix.h"

namespace ddp {

int64_t keyed_permutation(int64_t x, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = std::bit_width(static_cast<uint64_t>(n - 1));
  bits += bits % 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  auto v = static_cast<uint64_t>(x);
  do {  // cycle-walking: a bijection of [0, 2^bits) restricted to [0, n)
    uint64_t left = v >> half, right = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t next = left ^ (core::splitmix64(key ^ (round << 56) ^ right) & mask);
      left = right;
      right = next;
    }
    v = (left << half) | right;
  } while (v >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(v);
}

MixtureOrder::MixtureOrder(std::vector<double> weights, std::vector<int64_t> sizes, uint64_t seed)
    : weights_(std::move(weights)), sizes_(std::move(sizes)), seed_(seed),
      quota_(weights_.size(), 0) {
  if (weights_.empty() || weights_.size() != sizes_.size()) {
    throw std::invalid_argument("MixtureOrder: one weight and one size per source");
  }
  const double sum = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  for (size_t k = 0; k < weights_.size(); ++k) {
    if (!(weights_[k] > 0) || sizes_[k] < 1) {
      throw std::invalid_argument("MixtureOrder: weights and sizes must be positive");
    }
    weights_[k] /= sum;
  }
  source_.reserve(kPeriod);
  rank_.reserve(kPeriod);
  for (int64_t i = 0; i < kPeriod; ++i) {
    const size_t k = core::most_behind(weights_, quota_, i);
    source_.push_back(static_cast<uint32_t>(k));
    rank_.push_back(quota_[k]++);
  }
}

std::pair<size_t, int64_t> MixtureOrder::at(int64_t p) const {
  const size_t k = source_[p % kPeriod];
  const int64_t draw = (p / kPeriod) * quota_[k] + rank_[p % kPeriod];
  const auto pass = static_cast<uint64_t>(draw / sizes_[k]);
  const uint64_t key = core::splitmix64(seed_ ^ core::splitmix64((uint64_t(k) << 40) ^ pass));
  return {k, keyed_permutation(draw % sizes_[k], sizes_[k], key)};
}

int64_t MixtureOrder::first_wrap(size_t k) const {
  if (quota_[k] == 0) return -1;
  // Its draw number sizes_[k]: in period draw / quota, at the table position of rank draw % quota.
  const int64_t period = sizes_[k] / quota_[k], rank = sizes_[k] % quota_[k];
  for (int64_t i = 0; i < kPeriod; ++i) {
    if (source_[i] == k && rank_[i] == rank) return period * kPeriod + i;
  }
  throw std::logic_error("MixtureOrder: no such draw");
}

int64_t MixtureOrder::bytes() const {
  return static_cast<int64_t>(source_.size() * sizeof(uint32_t) + rank_.size() * sizeof(int64_t));
}

}  // namespace ddp
