// Periodic actions: what the training loop does between steps (evaluation, samples, memory
// tables, checkpoints, and whatever comes next), each registered once with a cadence and run by
// one mechanism, so that adding one never means editing the loop (docs/DESIGN.md, "Where to add
// things", "A periodic action").
//
// Contract: actions run after the step they are due at, in registration order, on the thread of
// the loop. An action that communicates (an evaluation's all-reduce, a memory table's gather, a
// checkpoint's gather of sharded moments) must be registered on every rank with the same cadence,
// so that every rank issues its collectives after the same steps; an action that does not (rank
// 0's text sample) may be registered on one rank only. Each action's wall time goes to its
// bucket ("evaluation", "checkpoints", ...): the `done:` line reports the buckets apart, and
// none of it counts as training time. Steps are numbered from 1, as the log numbers them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace train {

// When an action is due. The fields add up: a cadence of every = 100 and after_last = true runs
// after steps 100, 200, ... and after the run's last step.
struct Cadence {
  int64_t every = 0;        // after every N-th step (0: not periodically)
  bool after_last = false;  // after the run's last step (train.steps, or an agreed stop)
  int64_t once_at = 0;      // after this one step (0: none)

  // Whether the action is due after step `step` (from 1); `last`: it is the run's last step.
  bool due(int64_t step, bool last) const {
    return (every > 0 && step % every == 0) || (after_last && last) ||
           (once_at > 0 && step == once_at);
  }
};

struct PeriodicAction {
  std::string name;    // what it is, for the reader of the code ("evaluation", "final checkpoint")
  std::string bucket;  // where its time is counted in the `done:` line ("evaluation", ...)
  Cadence cadence;
  std::function<void(int64_t step)> run;  // `step`: the step just done (from 1)
};

// Seconds per bucket, in the order the buckets were first registered.
using TimeBuckets = std::vector<std::pair<std::string, double>>;

class PeriodicActions {
 public:
  // Registers `action` after those already registered; its bucket is created if new.
  void add(PeriodicAction action);
  // Runs every action due after `step`, in registration order, each timed into its bucket.
  // Returns the seconds they took together.
  double run_due(int64_t step, bool last);

  const TimeBuckets& buckets() const { return buckets_; }

 private:
  std::vector<std::pair<PeriodicAction, size_t>> actions_;  // (action, its bucket's index)
  TimeBuckets buckets_;
};

}  // namespace train
