#include "train/spike_guard.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <stdexcept>

#include "train/loss_scaler.h"

namespace train {

SpikeGuard::SpikeGuard(SpikeGuardOptions options, c10::Device device) : options_(options) {
  if (!options_.enabled()) throw std::invalid_argument("SpikeGuard: train.skip_spikes is off");
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  const auto b8 = at::TensorOptions().dtype(at::kBool).device(device);
  window_ = at::zeros({kJudgedValues, options_.window}, f64);
  filled_ = at::zeros({1}, f64);
  next_ = at::zeros({1}, i64);
  slots_ = at::arange(options_.window, i64);
  at_next_ = at::zeros({options_.window}, b8);
  values_ = at::zeros({kJudgedValues}, f64);
  mean_ = at::zeros({kJudgedValues}, f64);
  std_ = at::zeros({kJudgedValues}, f64);
  std::array<double, kJudgedValues> z{};
  z[kLoss] = options_.loss_z;
  z[kGradNorm] = options_.grad_norm_z;
  z_ = at::tensor(at::ArrayRef<double>(z), at::kDouble).to(device);
  judged_ = (z_ > 0);
  over_ = at::zeros({kJudgedValues}, b8);
  spike_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  stats_ = at::zeros({kStateSlots}, f64);
  last_spike_ = at::zeros({kStateSlots}, f64);
}

void SpikeGuard::judge(const at::Tensor& loss, const at::Tensor& norm) {
  at::NoGradGuard no_grad;
  values_.narrow(0, kLoss, 1).copy_(loss.view({1}));
  values_.narrow(0, kGradNorm, 1).copy_(norm.view({1}));
  at::mean_out(mean_, window_, {1});
  at::std_out(std_, window_, {1}, /*unbiased=*/false, /*keepdim=*/false);
  // An outlier: more than z deviations above the mean, of a window that is full and not flat.
  at::gt_out(over_, values_ - mean_, std_ * z_);
  over_.logical_and_(judged_).logical_and_(std_ > 0).logical_and_(filled_ >= options_.window);
  at::Tensor spike =
      over_.any().view({1}).logical_or_(values_.narrow(0, kLoss, 1).isfinite().logical_not());
  spike_.copy_(spike);
  // Kept for the log: the numbers of the last spike (a where on the device, no host read).
  at::Tensor by_value = stats_.view({kJudgedValues, kStats});  // row-major: state_slot
  by_value.select(1, kStepValue).copy_(values_);
  by_value.select(1, kWindowMean).copy_(mean_);
  by_value.select(1, kWindowStd).copy_(std_);
  last_spike_.copy_(at::where(spike, stats_, last_spike_));
}

void SpikeGuard::record(const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const at::Tensor applied = skip.view({1}) == 0;
  at::eq_out(at_next_, slots_, next_);
  at_next_.logical_and_(applied);
  // The applied step's two values go into the slot `next_` (where, not masked_fill: a device
  // value, no host read).
  window_.copy_(at::where(at_next_, values_.unsqueeze(1), window_));
  next_.add_(applied).remainder_(options_.window);
  filled_.add_(applied).clamp_max_(static_cast<double>(options_.window));
}

void SpikeGuard::write_state(at::Tensor out) const {
  at::NoGradGuard no_grad;
  out.copy_(last_spike_);
}

std::vector<int64_t> parse_spike_injections(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& entry : injection_entries(text)) {
    int64_t step = -1;
    const auto r = std::from_chars(entry.data(), entry.data() + entry.size(), step);
    if (r.ec != std::errc() || r.ptr != entry.data() + entry.size() || step < 1) {
      throw std::invalid_argument(fmt::format(
          "train.inject_spike: '{}' is not a step (an integer >= 1; several: 'STEP; STEP')",
          entry));
    }
    out.push_back(step);
  }
  return out;
}

}  // namespace train
