// LossScaler: dynamic loss scaling for fp16 training that every rank agrees on without a
// collective of its own.
//
// Each micro-batch's loss is multiplied by the scale before backward; the Reducer all-reduces the
// scaled gradients; then unscale() divides the reduced gradient buckets by the scale and checks
// them for inf/NaN (ATen's _amp_foreach_non_finite_check_and_unscale_). The buckets hold the SUM
// over ranks, so every rank sees the same values and reaches the same verdict: a non-finite
// gradient on one rank makes the sum non-finite on all. update() then applies ATen's
// _amp_update_scale_: after a non-finite step the scale is multiplied by `backoff` (the step is
// skipped: no clipping, no update); after `growth_interval` finite steps in a row it is multiplied
// by `growth`. The scale, the growth tracker, the verdict and the counts of skipped steps stay on
// the training device: the optimizer takes the verdict as a tensor (its kernel skips the update),
// so a step never reads it on the host. The Trainer copies them out on logged steps only
// (write_state).
//
// Disabled (fp32, bf16): scale() is 1 and unscale() does nothing, but the verdict still holds
// reject_nonfinite()'s check of the gradient norm, so a non-finite step is skipped and counted in
// every precision (one mechanism with fp16's, train.max_skipped_steps included). The loss-spike
// guard (train/spike_guard.h) adds its verdict with reject_spike(): such a step is skipped and
// counted the same way, but it is no overflow, so fp16's scale does not back off for it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/communicator.h"

namespace train {

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  LossScaler(LossScalerOptions options, c10::Device device);

  bool enabled() const { return options_.enabled; }
  // The current scale as a 0-dim-like [1] float tensor on the device (1 when disabled).
  const at::Tensor& scale() const { return scale_; }

  // Clears the verdict; fp16: divides `buffers` (the reduced gradient buckets) by the scale in
  // place and records whether any value is inf or NaN.
  void unscale(const std::vector<at::Tensor>& buffers);
  // The step's verdict: float [1], 1 where a gradient or the gradient norm was inf or NaN, else
  // 0; it stays until the next unscale().
  const at::Tensor& found_inf() const { return found_inf_; }
  // Sharded gradients (ddp.shard): each rank unscaled only its blocks, so its verdict covers
  // them only; this makes it the verdict over every rank's blocks (a max all-reduce of the device
  // flag on `comm`, no host read). Collective; no-op when disabled.
  void combine_verdict(ddp::Communicator& comm);
  // Every precision: sets the verdict where `norm` (the global gradient norm, float32 0-dim, the
  // same on every rank: GradClipper::norm) is inf or NaN. Queues device work only; allocates
  // nothing. Call after unscale() and combine_verdict(), before update().
  void reject_nonfinite(const at::Tensor& norm);
  // The spike guard's verdict (float [1], 1: skip the step). Call before update().
  void reject_spike(const at::Tensor& spike);
  // fp16: backs off or grows the scale according to the non-finite verdict. Every precision:
  // makes skip() (non-finite or spike) and counts a skipped step (`step`: its number, from 1).
  void update(int64_t step);
  // After update(): float [1], 1 where the step is skipped (the optimizer kernel reads it).
  const at::Tensor& skip() const { return skip_; }

  // write_state's slots, in this order; the last enumerator is their number. Readers index by
  // these names (StepMetrics::read), so a slot added here moves no other.
  enum StateSlot : int64_t {
    kSkipSlot,          // the last step's verdict: 1 skipped, 0 applied
    kScaleSlot,         // the loss scale (1 when disabled)
    kLongestRunSlot,    // the longest run of skipped steps in a row since the last write_state
    kSkippedTotalSlot,  // skipped steps in total
    kSpikesTotalSlot,   // of those, skipped as spikes
    kLastSkippedSlot,   // the last skipped step's number (0: none)
    kStateSlots
  };
  // Device state for the log, as float64 into `out` (kStateSlots values on the device, as
  // StateSlot says). Resets the longest run to the current one. Queues device work only.
  void write_state(at::Tensor out);

 private:
  LossScalerOptions options_;
  at::Tensor scale_;           // float [1]
  at::Tensor inv_scale_;       // float [1]
  at::Tensor growth_tracker_;  // int [1]
  at::Tensor found_inf_;       // float [1]
  at::Tensor spike_;           // float [1]: reject_spike()'s verdict, until update()
  at::Tensor skip_;            // float [1]: found_inf_ or spike_, made by update()
  at::Tensor norm_check_;      // float [1]: scratch of reject_nonfinite()
  at::Tensor in_a_row_;        // float [1]: skipped steps in a row, up to the last update()
  at::Tensor longest_run_;     // float [1]: the longest such run since the last write_state()
  at::Tensor skipped_total_;   // float [1]
  at::Tensor spikes_total_;    // float [1]: skipped for a spike, not for inf/NaN
  at::Tensor last_skipped_;    // double [1]: the number of the last skipped step (0: none)
};

// train.inject_nonfinite: "RANK:STEP" entries separated by ';' (steps from 1). Throws
// std::invalid_argument naming the key for a malformed entry.
std::vector<std::pair<int, int64_t>> parse_nonfinite_injections(const std::string& text);

// The entries of a test hook's "A; B; ..." text, trimmed, empty ones left out.
std::vector<std::string> injection_entries(const std::string& text);

}  // namespace train
