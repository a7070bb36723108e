#include "train/step_metrics.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace train {

StepMetrics::StepMetrics(c10::Device device, std::vector<std::string> objective)
    : objective_names_(std::move(objective)) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  loss_ = at::zeros({}, f64);
  if (!objective_names_.empty()) {
    objective_ = at::zeros({static_cast<int64_t>(objective_names_.size())}, f64);
  }
  slots_ = at::zeros({kSlots + static_cast<int64_t>(objective_names_.size())}, f64);
}

void StepMetrics::read(StepResult& r, ddp::Communicator& control, const GradClipper& clipper,
                       LossScaler& scaler, const SpikeGuard* guard, int64_t max_skipped_steps) {
  // The one device-to-host read of a logged step: everything the log needs, copied at once.
  at::NoGradGuard no_grad;
  slots_.narrow(0, kLossSlot, 1).copy_(loss_.view({1}));
  slots_.narrow(0, kNormSlot, 1).copy_(clipper.norm().view({1}));
  scaler.write_state(slots_.narrow(0, kScalerSlots, LossScaler::kStateSlots));
  if (guard != nullptr) guard->write_state(slots_.narrow(0, kGuardSlots, SpikeGuard::kStateSlots));
  if (objective_.defined()) slots_.narrow(0, kSlots, objective_.numel()).copy_(objective_);
  const at::Tensor host = slots_.to(at::kCPU);
  ++host_reads_;
  const double* v = host.data_ptr<double>();
  // The loss and the objective's sums (read with the slots' copy), summed over ranks at once.
  at::Tensor loss = at::tensor({v[kLossSlot]}, at::kDouble);
  if (objective_.defined()) loss = at::cat({loss, host.narrow(0, kSlots, objective_.numel())});
  control.all_reduce(loss, ddp::ReduceOp::kSum, "loss");
  r.loss = loss.data_ptr<double>()[0];
  r.objective.clear();
  for (size_t i = 0; i < objective_names_.size(); ++i) {
    r.objective.emplace_back(objective_names_[i], loss.data_ptr<double>()[i + 1]);
  }
  r.grad_norm = v[kNormSlot];
  r.metrics_read = true;
  const double* s = v + kScalerSlots;  // LossScaler::write_state's
  Skips skips;
  skips.since = last_read_step_;
  last_read_step_ = r.step;
  r.skipped = s[LossScaler::kSkipSlot] > 0;
  if (scaler.enabled()) r.loss_scale = s[LossScaler::kScaleSlot];
  const auto total = static_cast<int64_t>(s[LossScaler::kSkippedTotalSlot]);
  const auto spikes = static_cast<int64_t>(s[LossScaler::kSpikesTotalSlot]);
  skips.new_skips = total - skipped_total_;
  skips.new_spikes = spikes - spikes_total_;
  skips.longest_run = static_cast<int64_t>(s[LossScaler::kLongestRunSlot]);
  skips.last = static_cast<int64_t>(s[LossScaler::kLastSkippedSlot]);
  skipped_total_ = total;
  spikes_total_ = spikes;
  if (guard != nullptr) {
    skips.guard = v + kGuardSlots;
    skips.spikes = &guard->options();
  }
  check_skipped(r, skips, control.rank(), max_skipped_steps, scaler.enabled());
}

namespace {

// "loss 3.1e+03 is 2.4e+04 standard deviations above the mean 3.12 of the last 100 applied steps",
// for the values of the last judged step that the guard found outliers (SpikeGuard::write_state).
std::string describe_spike(const double* g, const SpikeGuardOptions& o) {
  struct Value {
    SpikeGuard::Judged slot;
    const char* name;
    double z;
  };
  std::vector<std::string> parts;
  for (const Value& j : {Value{SpikeGuard::kLoss, "loss", o.loss_z},
                         Value{SpikeGuard::kGradNorm, "grad_norm", o.grad_norm_z}}) {
    const double value = g[SpikeGuard::state_slot(j.slot, SpikeGuard::kStepValue)];
    const double mean = g[SpikeGuard::state_slot(j.slot, SpikeGuard::kWindowMean)];
    const double sd = g[SpikeGuard::state_slot(j.slot, SpikeGuard::kWindowStd)];
    if (j.z <= 0) continue;
    if (!std::isfinite(value)) {
      parts.push_back(fmt::format("{} is {}", j.name, value));
    } else if (sd > 0 && value - mean > j.z * sd) {
      parts.push_back(fmt::format("{} {:.4g} is {:.3g} standard deviations above the mean {:.4g}",
                                  j.name, value, (value - mean) / sd, mean));
    }
  }
  return fmt::format("{} of the last {} applied steps (train.skip_spikes)",
                     fmt::join(parts, " and "), o.window);
}

}  // namespace

void StepMetrics::check_skipped(const StepResult& r, const Skips& s, int rank,
                                int64_t max_skipped_steps, bool fp16) const {
  const std::string scale = fp16 ? fmt::format("; loss scale now {:g}", r.loss_scale) : "";
  const int64_t nonfinite = s.new_skips - s.new_spikes;
  if (s.new_skips > 0 && rank == 0) {
    if (s.new_skips == 1 && s.new_spikes == 1) {
      spdlog::warn("step {}: spike: {}: step skipped on every rank, parameters unchanged", s.last,
                   describe_spike(s.guard, *s.spikes));
    } else if (s.new_skips == 1) {
      spdlog::warn("step {}: non-finite gradient (inf or NaN) on some rank: step skipped on every "
                   "rank, parameters unchanged{}",
                   s.last, scale);
    } else {
      spdlog::warn(
          "steps {}-{}: {} step(s) were skipped on every rank, parameters unchanged ({} "
          "with a non-finite gradient (inf or NaN) on some rank, {} loss or gradient "
          "norm spike(s) under train.skip_spikes; the last at step {}{}){}",
          s.since + 1, r.step, s.new_skips, nonfinite, s.new_spikes, s.last,
          s.new_spikes > 0 ? ", the last spike's " + describe_spike(s.guard, *s.spikes) : "",
          scale);
    }
  }
  if (s.longest_run >= max_skipped_steps) {
    throw NonFiniteFatal(fmt::format(
        "{} steps in a row (seen at step {}) were skipped{} (train.max_skipped_steps = {}): {}",
        s.longest_run, r.step,
        s.new_spikes > 0 ? " as spikes or for non-finite gradients" : " for non-finite gradients",
        max_skipped_steps,
        s.new_spikes > 0 ? "the loss or gradient norm stayed far above its recent mean. Lower "
                           "train.lr, set train.grad_clip, or raise train.skip_spikes' loss_z "
                           "and grad_norm_z."
        : fp16           ? "the model diverged or overflows fp16. Lower train.lr, or train with "
                           "train.precision: bf16 or fp32."
                         : "the model diverged. Lower train.lr or set train.grad_clip."));
  }
}

}  // namespace train
