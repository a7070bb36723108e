// The learning-rate schedule (train.schedule): the factor every group's peak learning rate is
// multiplied by at each step (docs/reference.md, "Learning-rate schedules").
//
// Steps are indices from 0 (Note [Step numbers] in train/trainer.cpp); T = train.steps, W =
// train.warmup_steps, r = train.min_lr_ratio.
//   warmup     i < W: (i + 1) / W
//   after it   r + (1 - r) * shape(p(i)), with the decay's progress
//              p(i) = min(1, p0 + (1 - p0) * max(0, i - a) / max(1, T - 1 - a))
//              from the plan's anchor a (the last step at progress p0) to 1 at the last step.
// A fresh plan has p0 = 0 and a = W (cosine, linear), or a = max(W, T - 1 - D) for wsd, whose
// decay takes the last D = round(train.decay_fraction * T) steps after a stable stage at the peak.
// Shapes: cosine 0.5 (1 + cos(pi p)); linear 1 - p; 1-sqrt 1 - sqrt(p) (wsd: train.decay_shape);
// constant stays at the peak.
//
// Resuming (Note [Coherent schedules across a resume]): the plan is saved with every checkpoint;
// a resume whose train.steps or train.decay_fraction differ from the saved plan's continues from
// the progress the saved plan had reached at the resume step, so the learning rate of the first
// resumed step is the one the interrupted run would have used, and the decay then reaches r at
// the new last step.
#pragma once

#include <cstdint>
#include <string>

#include "train/options.h"

namespace train {

// What a resume needs of the schedule a checkpoint was written under.
struct SchedulePlan {
  int64_t steps = 0;          // train.steps the plan ends at
  double decay_fraction = 0;  // train.decay_fraction it was made with
  int64_t anchor = 0;         // a: the last step at progress p0
  double progress = 0;        // p0
  bool operator==(const SchedulePlan&) const = default;
};

class Schedule {
 public:
  // A fresh plan for `options` (train.steps, warmup, schedule, decay).
  explicit Schedule(const TrainOptions& options);

  // The factor of the peak learning rate at step index `i` (from 0).
  double factor(int64_t i) const;
  // The decay's progress at step index `i` (0 before the decay, 1 at its end).
  double progress(int64_t i) const;
  const SchedulePlan& plan() const { return plan_; }

  // Continues after `steps_done` steps from a checkpoint written under `saved`: the same plan
  // when train.steps and train.decay_fraction are unchanged, else a new anchor at `steps_done`
  // (Note [Coherent schedules across a resume]).
  void resume(int64_t steps_done, const SchedulePlan& saved);

  // The plan as a checkpoint's metadata text ("steps=.. decay_fraction=.. anchor=.. progress=..",
  // reals with 17 significant digits: they read back exactly), and back. Throws
  // std::invalid_argument naming the text.
  static std::string to_text(const SchedulePlan& plan);
  static SchedulePlan from_text(const std::string& text);

 private:
  // The anchor of a fresh plan for train.steps = `steps` (and plan_'s decay fraction).
  int64_t fresh_anchor(int64_t steps) const;
  double shape(double p) const;

  ScheduleKind kind_;
  DecayShape shape_;  // the decay's: cosine, linear, or wsd's train.decay_shape
  int64_t warmup_;
  double min_ratio_;
  SchedulePlan plan_;
};

}  // namespace train
