#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace train {

double learning_rate(int64_t step, int64_t total_steps, int64_t warmup_steps, double peak_lr,
                     double min_lr_ratio) {
  if (step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace train
