#include "train/periodic.h"

#include <chrono>

namespace train {

void PeriodicActions::add(PeriodicAction action) {
  size_t bucket = 0;
  while (bucket < buckets_.size() && buckets_[bucket].first != action.bucket) ++bucket;
  if (bucket == buckets_.size()) buckets_.emplace_back(action.bucket, 0.0);
  actions_.emplace_back(std::move(action), bucket);
}

double PeriodicActions::run_due(int64_t step, bool last) {
  using Clock = std::chrono::steady_clock;
  double took = 0;
  for (auto& [action, bucket] : actions_) {
    if (!action.cadence.due(step, last)) continue;
    const auto start = Clock::now();
    action.run(step);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    buckets_[bucket].second += seconds;
    took += seconds;
  }
  return took;
}

}  // namespace train
