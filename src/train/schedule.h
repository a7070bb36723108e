// Learning-rate schedule: linear warmup to the peak, then cosine decay to min_lr_ratio * peak at
// the last step.
#pragma once

#include <cstdint>

namespace train {

double learning_rate(int64_t step, int64_t total_steps, int64_t warmup_steps, double peak_lr,
                     double min_lr_ratio);

}  // namespace train
