#include "train/unit_gate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <exception>
#include <stdexcept>

#include "ddp/errors.h"

namespace train {
namespace {

// Identity in forward; in backward, before the gradient flows on into the unit, the gate gathers
// the unit (and prefetches the one before it).
struct LeaveUnit final : public torch::autograd::Function<LeaveUnit> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            UnitGatherer* gate, int64_t event) {
    ctx->saved_data["gate"] = reinterpret_cast<int64_t>(gate);
    ctx->saved_data["event"] = event;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* gate = reinterpret_cast<UnitGatherer*>(ctx->saved_data.at("gate").toInt());
    gate->before_backward(static_cast<size_t>(ctx->saved_data.at("event").toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void UnitGatherer::begin_pass() {
  reducer_.begin_unit_pass();
  in_pass_ = true;
  events_.clear();
  first_event_.clear();
  left_ = false;
  backward_from_ = 0;
}

void UnitGatherer::end_pass() {
  if (in_pass_ && !recorded_) {
    order_ = events_;
    recorded_ = true;
  }
  in_pass_ = false;
  if (!pinned_) reducer_.free_all_units();
}

// Note [A failed pass]
// A rank that runs out of memory inside a pass (forward or backward of a micro-batch under
// ddp.shard: parameters) must not stop issuing collectives: the other ranks go on gathering the
// units and reduce-scattering their gradients, and would wait for it forever. So the failing rank
// goes on where it stopped, without computing: in forward it enters the remaining units in the
// recorded order (each enter gathers its unit and prefetches the next, as theirs do), then it
// walks backward from the last event down, gathering each unit (and prefetching the one before)
// where it had not yet, and lands each unit's gradients after the backward of the unit's first
// event (Reducer::land_unit: in the synced micro-batch the buckets are posted as they complete,
// the same order the hooks post them in; unit 0 of a tied model completes only at event 0, as in
// autograd, where its parameters' gradients are accumulated once every use has contributed).
// Nothing in between frees what the other ranks still hold: units prefetched before the failure
// are waited for, not posted again. The micro-batches after it run as dry passes. Every rank
// then reaches the status vote with the same collectives issued, and the step is redone after
// the agreed fallback. The order is the model's declared one, so even the first pass can fail
// this way. Out of memory again in the dry pass (a gather's buffer) cannot be voted on: the
// Trainer ends the job (memory::OutOfMemoryAbort).
bool UnitGatherer::first_event(size_t event) const {
  for (size_t e = 0; e < event; ++e) {
    if (order_[e] == order_[event]) return false;
  }
  return true;
}

void UnitGatherer::complete_failed_pass() {
  if (!recorded_) {
    throw std::logic_error("UnitGatherer: a failed pass before the unit order is known");
  }
  in_pass_ = true;
  if (backward_from_ == 0) {
    // Forward: the unit entered last gets its gather and the next one's prefetch (posted already
    // unless they were what ran out: both do nothing then) and is left as the others leave it;
    // then the rest are entered.
    const size_t done = events_.size();
    if (done > 0 && !left_) {
      const size_t pos = done - 1;
      reducer_.gather_unit(order_[pos]);
      const bool last = pos + 1 == order_.size();
      if (prefetch_ && !last) reducer_.prefetch_unit(order_[pos + 1]);
      if (reshard_after_forward_ && !last) reducer_.free_unit(order_[pos]);
    }
    for (size_t pos = done; pos < order_.size(); ++pos) {
      enter(order_[pos]);
      if (reshard_after_forward_ && pos + 1 < order_.size()) reducer_.free_unit(order_[pos]);
    }
  }
  // Backward, from the event that failed or from the last; a unit whose gradients all landed
  // had its backward (and its gathers) already.
  const size_t start = backward_from_ > 0 ? backward_from_ - 1 : order_.size() - 1;
  for (size_t e = start + 1; e-- > 0;) {
    if (reducer_.unit_landed(order_[e])) continue;
    before_backward(e);
    if (first_event(e)) reducer_.land_unit(order_[e]);
  }
  end_pass();
}

void UnitGatherer::dry_pass() {
  begin_pass();
  complete_failed_pass();
}

// Note [Units in step]
// Evaluation splits the validation samples (and each task's examples) over the ranks, so ranks run
// different numbers of forwards, and a text sample is drawn by rank 0 alone; under ddp.shard:
// parameters every forward gathers every unit, and a gather needs every rank. Pinning every unit
// would hold the whole model on every rank. Instead each forward begins, at its first unit, with
// an all-reduce (MAX) of "I run one", and a rank that has run all of its forwards calls
// end_lockstep(), which answers "I do not" and, while the result says that another rank does,
// gathers and frees the units in the forward's order (the recorded order: the same gathers as
// the running rank's enters, which free each unit again at its leave). When every rank answers
// "I do not", all leave together. One extra all-reduce per forward; never more than one unit
// gathered for evaluation or generation. A collective other than the gathers (evaluation's
// all-reduce of its sums, after each rank's slice) must not begin while another rank still runs a
// forward, whose gathers it would meet: evaluation calls settle() before it, which serves the
// other ranks' forwards as end_lockstep() does and stays in step.
void UnitGatherer::begin_lockstep() {
  if (!recorded_) throw std::logic_error("UnitGatherer: in step before the unit order is known");
  lockstep_ = true;
  lockstep_pos_ = 0;
}

void UnitGatherer::end_lockstep() {
  if (lockstep_pos_ != 0)
    throw std::logic_error("UnitGatherer: in step, a forward left unfinished");
  while (reducer_.any_rank(false, "units in step")) {
    for (const size_t unit : order_) {
      reducer_.gather_unit(unit);
      reducer_.free_unit(unit);
    }
  }
  lockstep_ = false;
}

void UnitGatherer::settle() {
  if (!lockstep_) return;
  end_lockstep();
  begin_lockstep();
}

LockstepUnits::LockstepUnits(UnitGatherer* gate, bool units) : gate_(gate), units_(units) {
  if (gate_ == nullptr) return;
  if (units_) {
    gate_->begin_lockstep();
  } else {
    gate_->pin();
  }
}

LockstepUnits::~LockstepUnits() noexcept {
  if (gate_ == nullptr) return;
  if (std::uncaught_exceptions() > 0 && units_) {
    gate_ = nullptr;  // the job ends: no collective from a destructor
    return;
  }
  try {
    finish();
  } catch (...) {
  }
}

void LockstepUnits::finish() {
  if (gate_ == nullptr) return;
  UnitGatherer* gate = gate_;
  gate_ = nullptr;
  if (units_) {
    gate->end_lockstep();
  } else {
    gate->unpin();
  }
}

void UnitGatherer::pin(bool frozen) {
  pinned_ = true;
  reducer_.gather_all_units(frozen);
}

void UnitGatherer::unpin() {
  pinned_ = false;
  reducer_.free_all_units();
}

void UnitGatherer::enter(size_t unit) {
  if (pinned_) return;
  if (lockstep_ && !in_pass_) {
    if (lockstep_pos_ == 0) reducer_.any_rank(true, "units in step");  // a forward begins
    if (order_[lockstep_pos_] != unit) {
      throw std::logic_error(
          fmt::format("UnitGatherer: unit {} entered in step where the order has "
                      "unit {}",
                      unit, order_[lockstep_pos_]));
    }
    lockstep_pos_ = (lockstep_pos_ + 1) % order_.size();
  }
  if (!in_pass_) {
    reducer_.gather_unit(unit);
    return;
  }
  const size_t pos = events_.size();
  if (recorded_ && (pos >= order_.size() || order_[pos] != unit)) {
    throw ddp::PlanError(fmt::format(
        "ddp.shard: parameters: the model entered unit {} as its unit #{} in this forward, but "
        "the first step's order was [{}]; every rank gathers the units in the recorded order, so "
        "the order must not change between steps (use ddp.shard: gradients for a model whose "
        "sequence of layers varies)",
        unit, pos, fmt::join(order_, ", ")));
  }
  if (first_event_.size() <= unit) first_event_.resize(unit + 1, kNoEvent);
  if (first_event_[unit] == kNoEvent) first_event_[unit] = pos;
  events_.push_back(unit);
  left_ = false;
  reducer_.gather_unit(unit);
  if (prefetch_ && recorded_ && pos + 1 < order_.size()) reducer_.prefetch_unit(order_[pos + 1]);
}

at::Tensor UnitGatherer::leave(size_t unit, const at::Tensor& x) {
  if (pinned_) return x;
  if (!in_pass_) {
    reducer_.free_unit(unit);
    return x;
  }
  // The event of this unit's latest enter.
  size_t event = events_.size();
  while (event > 0 && events_[event - 1] != unit) --event;
  if (event == 0) {
    throw std::logic_error(fmt::format("UnitGatherer: unit {} left without being entered", unit));
  }
  --event;
  const bool last = recorded_ && event + 1 == order_.size();
  if (reshard_after_forward_ && !last) reducer_.free_unit(unit);
  left_ = true;
  if (!x.requires_grad()) return x;
  return LeaveUnit::apply(x, this, static_cast<int64_t>(event));
}

void UnitGatherer::before_backward(size_t event) {
  if (pinned_ || event >= events_.size()) return;
  // The gradient of this event's output is complete, so backward is done with every event after
  // it: a unit used only there is freed, its frozen tensors with it (the Reducer frees a unit
  // that holds none when its gradients land; one that holds some waits for this, since their
  // uses in the gradient of its input can follow its last gradient). The events between here and
  // where backward was are visited once per pass.
  const size_t from = backward_from_ == 0 ? events_.size() : backward_from_;
  for (size_t later = event + 1; later < from; ++later) {
    if (first_event_[events_[later]] > event) reducer_.free_unit(events_[later]);
  }
  backward_from_ = event + 1;
  if (takes_backward(event)) reducer_.gather_unit(events_[event]);
  if (prefetch_ && event > 0 && takes_backward(event - 1)) {
    reducer_.prefetch_unit(events_[event - 1]);
  }
}

bool UnitGatherer::takes_backward(size_t event) const {
  // The pass's first unit reads the batch, which takes no gradient: without parameters of its
  // own (LoRA's frozen embeddings) nothing of it runs in backward, so it is not gathered for it
  // (the same answer on every rank, and in a failed pass's walk).
  return event > 0 || reducer_.unit_has_parameters(events_[0]);
}

}  // namespace train
