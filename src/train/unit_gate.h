// UnitGatherer: gathers and frees a parameter-sharded model (ddp.shard: parameters, ZeRO-3) unit by
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
//   gradient lands and reduce-scatters its gradients (ddp/reducer.h); a unit with frozen tensors
//   (ddp::ReducerOptions::frozen: LoRA's base) is freed here instead, when backward reaches an
//   event before all of the unit's (its input's gradient is then complete); end_pass() frees
//   what is left (parameters that got no gradient, units whose input takes none). The pass's
//   first unit, when it has no parameters (LoRA's frozen embeddings), is not gathered for
//   backward: its input is the batch, so nothing of it runs there.
// - Order: the model's declared order (models::ParameterUnits::unit_order), or else the first
//   pass's sequence of entered units; every pass must enter the same units in the same order,
//   checked before each gather is posted, so a model that changes it is refused with
//   ddp::PlanError on every rank at the same unit, never a hang.
// - Out of memory inside a pass (Note [A failed pass], unit_gate.cpp): the rank that ran out
//   completes the pass without computing (complete_failed_pass: the gathers, prefetches and
//   gradient reduce-scatters the other ranks still post, in their order), and runs the
//   micro-batches left as dry passes, so that every rank reaches the status vote.
// - Outside a pass each enter gathers and each leave frees, without prefetch or order check;
//   pin() gathers every unit and makes enter/leave no-ops until unpin() (checkpoints, tests);
//   pin(false) leaves the units' frozen tensors (LoRA's base) sharded: a checkpoint saves none.
// - In step (begin_lockstep() .. end_lockstep(): evaluation, rank 0's text samples): forwards
//   that only some ranks run, or that ranks run different numbers of (each rank's slice of the
//   validation data), gather one unit at a time while no rank holds more than that: each forward
//   begins with one small all-reduce saying that some rank runs one, and end_lockstep() has a
//   rank that has run all of its own gather the units in order, without computing, for as long
//   as another rank still runs one (Note [Units in step], unit_gate.cpp). Collective. A rank that
//   reaches a collective of its own in step (evaluation's all-reduce of its sums) first calls
//   settle(), which does the same and stays in step.
// - Every call is collective in the sense of the Reducer's: every rank makes the same calls.
//   Backward on CPU runs on the calling thread; on CUDA, autograd's device thread calls leave's
//   backward, which the Reducer serialises with its hooks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "ddp/reducer.h"
#include "models/capabilities.h"

namespace train {

class UnitGatherer final : public models::UnitGate {
 public:
  // `order`: the units in the order forward enters them (empty: recorded from the first pass).
  UnitGatherer(ddp::Reducer& reducer, bool reshard_after_forward, bool prefetch,
               std::vector<size_t> order = {})
      : reducer_(reducer), reshard_after_forward_(reshard_after_forward), prefetch_(prefetch),
        order_(std::move(order)), recorded_(!order_.empty()) {}

  void enter(size_t unit) override;
  at::Tensor leave(size_t unit, const at::Tensor& x) override;
  // In step: end_lockstep() then begin_lockstep() (every rank has run its forwards); elsewhere
  // nothing. Collective.
  void settle() override;

  void begin_pass();
  // After a pass whose forward and backward ended normally: frees what is still gathered.
  void end_pass();
  // After an exception (out of memory) left this rank's pass half done: the rest of its
  // collectives without computing, then end_pass(). Collective.
  void complete_failed_pass();
  // One whole pass without computing (a micro-batch after a failed one). Collective.
  void dry_pass();
  // In step (see above): every rank calls both, at the same point. Collective.
  void begin_lockstep();
  void end_lockstep();
  bool in_lockstep() const { return lockstep_; }
  void pin(bool frozen = true);
  void unpin();
  bool pinned() const { return pinned_; }
  bool in_pass() const { return in_pass_; }
  void set_prefetch(bool on) { prefetch_ = on; }

  // Called by leave's autograd function when backward reaches the end of event `event`'s unit.
  void before_backward(size_t event);
  // Whether backward runs through event `event` (false only for a first unit without parameters).
  bool takes_backward(size_t event) const;

 private:
  ddp::Reducer& reducer_;
  bool reshard_after_forward_;
  bool prefetch_;
  // The event whose unit is entered at event `event` for the first time in the pass: its
  // gradients land after the backward of that event.
  bool first_event(size_t event) const;

  bool in_pass_ = false;
  bool pinned_ = false;
  std::vector<size_t> order_;   // declared, or the units entered in the first pass, in order
  std::vector<size_t> events_;  // this pass's
  static constexpr size_t kNoEvent = static_cast<size_t>(-1);
  std::vector<size_t> first_event_;  // unit -> its first event in this pass (kNoEvent: none)
  bool recorded_ = false;
  // In step: this rank runs a forward (announced) or has run all of its own (false).
  bool lockstep_ = false;
  size_t lockstep_pos_ = 0;   // where the forward under way is in order_
  bool left_ = false;         // this pass's last entered unit was left
  size_t backward_from_ = 0;  // the lowest event whose backward began (events_.size(): none)
};

// RAII: the gate in step for the scope (UnitGatherer::begin_lockstep), or for a model without units
// (`units` false: one unit, which its forward never enters) every unit pinned; finish() ends it
// (collective: every rank calls it at the same point). A destructor reached by an exception only
// leaves the mode (the job is ending). A null gate does nothing.
class LockstepUnits {
 public:
  LockstepUnits(UnitGatherer* gate, bool units);
  ~LockstepUnits() noexcept;
  LockstepUnits(const LockstepUnits&) = delete;
  LockstepUnits& operator=(const LockstepUnits&) = delete;
  void finish();

 private:
  UnitGatherer* gate_;
  bool units_;
};

// RAII: every unit gathered for the scope (UnitGatherer::pin, `frozen` as there); a null gate does
// nothing.
class PinnedUnits {
 public:
  explicit PinnedUnits(UnitGatherer* gate, bool frozen = true)
      : gate_(gate != nullptr && !gate->pinned() ? gate : nullptr) {
    if (gate_ != nullptr) gate_->pin(frozen);
  }
  ~PinnedUnits() noexcept {
    if (gate_ != nullptr) gate_->unpin();
  }
  PinnedUnits(const PinnedUnits&) = delete;
  PinnedUnits& operator=(const PinnedUnits&) = delete;

 private:
  UnitGatherer* gate_;
};

}  // namespace train
