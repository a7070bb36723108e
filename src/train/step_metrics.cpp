#include "train/step_metrics.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace train {

StepMetrics::StepMetrics(c10::Device device) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  loss_ = at::zeros({}, f64);
  slots_ = at::zeros({2 + LossScaler::kStateSlots}, f64);
}

void StepMetrics::read(StepResult& r, ddp::Communicator& control, const GradClipper& clipper,
                       LossScaler& scaler, int64_t max_skipped_steps) {
  // The one device-to-host read of a logged step: everything the log needs, copied at once.
  at::NoGradGuard no_grad;
  slots_.narrow(0, 0, 1).copy_(loss_.view({1}));
  slots_.narrow(0, 1, 1).copy_(clipper.norm().view({1}));
  scaler.write_state(slots_.narrow(0, 2, LossScaler::kStateSlots));
  const at::Tensor host = slots_.to(at::kCPU);
  ++host_reads_;
  const double* v = host.data_ptr<double>();
  at::Tensor loss = at::tensor({v[0]}, at::kDouble);
  control.all_reduce(loss, ddp::ReduceOp::kSum, "loss");
  r.loss = loss.data_ptr<double>()[0];
  r.grad_norm = v[1];
  r.metrics_read = true;
  const int64_t since = last_read_step_;
  last_read_step_ = r.step;
  r.skipped = v[2] > 0;
  if (scaler.enabled()) r.loss_scale = v[3];
  const auto total = static_cast<int64_t>(v[5]);
  const int64_t new_skips = total - skipped_total_;
  skipped_total_ = total;
  check_skipped(r, since, new_skips, static_cast<int64_t>(v[4]), control.rank(), max_skipped_steps,
                scaler.enabled());
}

void StepMetrics::check_skipped(const StepResult& r, int64_t since, int64_t new_skips,
                                int64_t longest_run, int rank, int64_t max_skipped_steps,
                                bool fp16) const {
  const std::string scale = fp16 ? fmt::format("; loss scale now {:g}", r.loss_scale) : "";
  if (new_skips > 0 && rank == 0) {
    if (new_skips == 1 && r.skipped) {
      spdlog::warn("step {}: non-finite gradient (inf or NaN) on some rank: step skipped on every "
                   "rank, parameters unchanged{}",
                   r.step, scale);
    } else {
      spdlog::warn(
          "steps {}-{}: {} step(s) had a non-finite gradient (inf or NaN) on some rank and "
          "were skipped on every rank, parameters unchanged{}",
          since + 1, r.step, new_skips, scale);
    }
  }
  if (longest_run >= max_skipped_steps) {
    throw NonFiniteFatal(
        fmt::format("{} steps in a row (seen at step {}) had non-finite gradients{} "
                    "(train.max_skipped_steps = {}): {}",
                    longest_run, r.step, scale, max_skipped_steps,
                    fp16 ? "the model diverged or overflows fp16. Lower train.lr, or train with "
                           "train.precision: bf16 or fp32."
                         : "the model diverged. Lower train.lr or set train.grad_clip."));
  }
}

}  // namespace train
