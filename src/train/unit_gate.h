// UnitGate: gathers and frees a parameter-sharded model (ddp.shard: parameters, ZeRO-3) unit by
// unit, where the model says each unit's use begins and ends (models::ParameterUnits).
//
// Contract:
// - Forward (a pass, begin_pass() .. end_pass()): enter(u) gathers unit u (waiting for its
//   all-gather if it was prefetched) and, from the second pass on, posts the all-gather of the
//   unit entered next in the recorded order (ddp.prefetch_units), so unit i + 1 travels while
//   unit i computes; leave(u, x) frees u (ddp.reshard_after_forward), except the pass's last unit,
//   which backward needs first. At most two units are gathered at a time in forward.
// - Backward: leave's identity autograd function runs before the unit's backward; it gathers the
//   unit again and prefetches the unit entered before it. The Reducer frees a unit when its last
//   gradient lands and reduce-scatters its gradients (ddp/reducer.h); end_pass() frees what is
//   left (parameters that got no gradient).
// - Order: the first pass's sequence of entered units is recorded; every later pass must enter
//   the same units in the same order, checked before each gather is posted, so a model that
//   changes it is refused with ddp::PlanError on every rank at the same unit, never a hang.
// - Outside a pass (evaluation, samples) each enter gathers and each leave frees, without
//   prefetch or order check; pin() gathers every unit and makes enter/leave no-ops until unpin()
//   (checkpoints, evaluation of a model without units).
// - Every call is collective in the sense of the Reducer's: every rank makes the same calls.
//   Backward on CPU runs on the calling thread; on CUDA, autograd's device thread calls leave's
//   backward, which the Reducer serialises with its hooks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ddp/reducer.h"
#include "models/capabilities.h"

namespace train {

class UnitGate final : public models::UnitGate {
 public:
  UnitGate(ddp::Reducer& reducer, bool reshard_after_forward, bool prefetch)
      : reducer_(reducer), reshard_after_forward_(reshard_after_forward), prefetch_(prefetch) {}

  void enter(size_t unit) override;
  at::Tensor leave(size_t unit, const at::Tensor& x) override;

  void begin_pass();
  void end_pass();
  void pin();
  void unpin();
  bool pinned() const { return pinned_; }
  void set_prefetch(bool on) { prefetch_ = on; }

  // Called by leave's autograd function when backward reaches the end of event `event`'s unit.
  void before_backward(size_t event);

 private:
  ddp::Reducer& reducer_;
  bool reshard_after_forward_;
  bool prefetch_;
  bool in_pass_ = false;
  bool pinned_ = false;
  std::vector<size_t> order_;   // the units entered in the first pass, in order
  std::vector<size_t> events_;  // this pass's
  bool recorded_ = false;
};

// RAII: every unit gathered for the scope (UnitGate::pin); a null gate does nothing.
class PinnedUnits {
 public:
  explicit PinnedUnits(UnitGate* gate)
      : gate_(gate != nullptr && !gate->pinned() ? gate : nullptr) {
    if (gate_ != nullptr) gate_->pin();
  }
  ~PinnedUnits() noexcept {
    if (gate_ != nullptr) gate_->unpin();
  }
  PinnedUnits(const PinnedUnits&) = delete;
  PinnedUnits& operator=(const PinnedUnits&) = delete;

 private:
  UnitGate* gate_;
};

}  // namespace train
