#include "train/loss_scaler.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <charconv>
#include <stdexcept>

namespace train {

LossScaler::LossScaler(LossScalerOptions options, c10::Device device) : options_(options) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({1}, options_.enabled ? options_.init_scale : 1.0, f32);
  inv_scale_ = at::full({1}, 1.0, f32);
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
  found_inf_ = at::zeros({1}, f32);
  norm_check_ = at::zeros({1}, f32);
  in_a_row_ = at::zeros({1}, f32);
  longest_run_ = at::zeros({1}, f32);
  skipped_total_ = at::zeros({1}, f32);
  spike_ = at::zeros({1}, f32);
  skip_ = at::zeros({1}, f32);
  spikes_total_ = at::zeros({1}, f32);
  last_skipped_ = at::zeros({1}, f32.dtype(at::kDouble));
}

void LossScaler::unscale(const std::vector<at::Tensor>& buffers) {
  at::NoGradGuard no_grad;
  found_inf_.zero_();  // every precision: reject_nonfinite() adds to this step's verdict
  if (!options_.enabled) return;
  at::reciprocal_out(inv_scale_, scale_);
  at::_amp_foreach_non_finite_check_and_unscale_(buffers, found_inf_, inv_scale_);
}

void LossScaler::combine_verdict(ddp::Communicator& comm) {
  if (!options_.enabled) return;
  comm.all_reduce(found_inf_, ddp::ReduceOp::kMax, "fp16 non-finite verdict");
}

void LossScaler::reject_nonfinite(const at::Tensor& norm) {
  at::NoGradGuard no_grad;
  // norm * 0 is 0 for a finite norm and NaN for inf or NaN; NaN becomes 1. In place: no allocation.
  norm_check_.copy_(norm.view({1})).mul_(0.0);
  at::nan_to_num_(norm_check_, /*nan=*/1.0);
  at::maximum_out(found_inf_, found_inf_, norm_check_);
}

void LossScaler::reject_spike(const at::Tensor& spike) {
  at::NoGradGuard no_grad;
  at::maximum_out(spike_, spike_, spike.view({1}));
}

void LossScaler::update(int64_t step) {
  at::NoGradGuard no_grad;
  if (options_.enabled) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth, options_.backoff,
                           options_.growth_interval);
  }
  at::maximum_out(skip_, found_inf_, spike_);
  // A spike counts as one only where the step was finite (inf/NaN is reported as such).
  spikes_total_.add_(skip_ - found_inf_);
  spike_.zero_();
  // skip is 0 or 1: a skipped step extends the run, an applied one resets it.
  in_a_row_.mul_(skip_).add_(skip_);
  at::maximum_out(longest_run_, longest_run_, in_a_row_);
  skipped_total_.add_(skip_);
  // last = skip ? step : last, in arithmetic (0 or 1): the step stays a host number.
  last_skipped_.mul_(1.0 - skip_.to(at::kDouble)).add_(skip_, static_cast<double>(step));
}

void LossScaler::write_state(at::Tensor out) {
  at::NoGradGuard no_grad;
  out.narrow(0, kSkipSlot, 1).copy_(skip_);
  out.narrow(0, kScaleSlot, 1).copy_(scale_);
  out.narrow(0, kLongestRunSlot, 1).copy_(longest_run_);
  out.narrow(0, kSkippedTotalSlot, 1).copy_(skipped_total_);
  out.narrow(0, kSpikesTotalSlot, 1).copy_(spikes_total_);
  out.narrow(0, kLastSkippedSlot, 1).copy_(last_skipped_);
  longest_run_.copy_(in_a_row_);
}

std::vector<std::string> injection_entries(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(start, end - start);
    entry.erase(0, entry.find_first_not_of(' '));
    entry.erase(entry.find_last_not_of(' ') + 1);
    start = end + 1;
    if (!entry.empty()) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<std::pair<int, int64_t>> parse_nonfinite_injections(const std::string& text) {
  std::vector<std::pair<int, int64_t>> out;
  for (const std::string& entry : injection_entries(text)) {
    const size_t colon = entry.find(':');
    int rank = -1;
    int64_t step = -1;
    bool ok = colon != std::string::npos;
    if (ok) {
      auto r = std::from_chars(entry.data(), entry.data() + colon, rank);
      auto s = std::from_chars(entry.data() + colon + 1, entry.data() + entry.size(), step);
      ok = r.ec == std::errc() && r.ptr == entry.data() + colon && s.ec == std::errc() &&
           s.ptr == entry.data() + entry.size() && rank >= 0 && step >= 1;
    }
    if (!ok) {
      throw std::invalid_argument(fmt::format(
          "train.inject_nonfinite: '{}' is not RANK:STEP (a rank >= 0 and a step >= 1)", entry));
    }
    out.emplace_back(rank, step);
  }
  return out;
}

}  // namespace train
