#include "train/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <stdexcept>

namespace train {

// Note [Coherent schedules across a resume]
// A schedule is a function of the step and of train.steps, so a resume that changes train.steps
// (--set train.steps=N, to extend a run or to end it sooner) would make the learning rate jump
// if it were simply recomputed. Instead the plan (where the decay is anchored, and at what
// progress) is saved with each checkpoint, and a resume under a different train.steps or
// train.decay_fraction re-anchors it at the resume step s:
// - the saved plan's progress at s, p_s, is where the decay stands;
// - p_s = 0 (warmup, or wsd's stable stage): the decay starts where a fresh plan for the new
//   train.steps starts it, or at s if that is already past: a wsd run extended from a checkpoint
//   of its stable stage stays stable until its new decay, and one resumed past its new decay's
//   start anneals from s to the new end;
// - p_s > 0 (decaying): the decay goes on from p_s at s to 1 at the new last step, stretched or
//   compressed, so the curve keeps its shape.
// The first resumed step's learning rate is the interrupted run's at s in both cases. A resume
// with the same train.steps and decay fraction keeps the saved plan, so a run resumed twice
// follows the plan of its first resume.

Schedule::Schedule(const TrainOptions& o)
    : kind_(o.schedule), shape_(o.schedule == ScheduleKind::kCosine   ? DecayShape::kCosine
                                : o.schedule == ScheduleKind::kLinear ? DecayShape::kLinear
                                                                      : o.decay_shape),
      warmup_(o.warmup_steps), min_ratio_(o.min_lr_ratio) {
  plan_ = {o.steps, o.decay_fraction, 0, 0.0};
  plan_.anchor = fresh_anchor(o.steps);
}

int64_t Schedule::fresh_anchor(int64_t steps) const {
  if (kind_ != ScheduleKind::kWsd) return warmup_;
  const auto decay = static_cast<int64_t>(std::llround(plan_.decay_fraction * double(steps)));
  return std::max(warmup_, steps - 1 - decay);
}

double Schedule::progress(int64_t i) const {
  const int64_t a = plan_.anchor;
  const double span = double(std::max<int64_t>(1, plan_.steps - 1 - a));
  const double past = double(std::max<int64_t>(0, i - a));
  return std::min(1.0, plan_.progress + (1.0 - plan_.progress) * past / span);
}

double Schedule::shape(double p) const {
  switch (shape_) {
    case DecayShape::kCosine: return 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    case DecayShape::kOneMinusSqrt: return 1.0 - std::sqrt(p);
    case DecayShape::kLinear: break;
  }
  return 1.0 - p;
}

double Schedule::factor(int64_t i) const {
  if (i < warmup_) return double(i + 1) / double(warmup_);
  if (kind_ == ScheduleKind::kConstant) return 1.0;
  return min_ratio_ + (1.0 - min_ratio_) * shape(progress(i));
}

void Schedule::resume(int64_t steps_done, const SchedulePlan& saved) {
  const SchedulePlan wanted = plan_;
  plan_ = saved;
  if (saved.steps == wanted.steps && saved.decay_fraction == wanted.decay_fraction) return;
  const double p = progress(steps_done);  // where the saved plan stands
  plan_ = wanted;
  if (p > 0) {
    plan_.anchor = steps_done;
    plan_.progress = p;
  } else {
    plan_.anchor = std::max(fresh_anchor(wanted.steps), steps_done);
  }
}

std::string Schedule::to_text(const SchedulePlan& plan) {
  return fmt::format("steps={} decay_fraction={:.17g} anchor={} progress={:.17g}", plan.steps,
                     plan.decay_fraction, plan.anchor, plan.progress);
}

SchedulePlan Schedule::from_text(const std::string& text) {
  SchedulePlan plan;
  long long steps = 0, anchor = 0;
  if (std::sscanf(text.c_str(), "steps=%lld decay_fraction=%lf anchor=%lld progress=%lf", &steps,
                  &plan.decay_fraction, &anchor, &plan.progress) != 4) {
    throw std::invalid_argument(
        fmt::format("a checkpoint's schedule '{}' is not 'steps=N decay_fraction=F anchor=A "
                    "progress=P'",
                    text));
  }
  plan.steps = steps;
  plan.anchor = anchor;
  return plan;
}

}  // namespace train
