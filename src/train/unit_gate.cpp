#include "train/unit_gate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include "ddp/errors.h"

namespace train {
namespace {

// Identity in forward; in backward, before the gradient flows on into the unit, the gate gathers
// the unit (and prefetches the one before it).
struct LeaveUnit final : public torch::autograd::Function<LeaveUnit> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            UnitGate* gate, int64_t event) {
    ctx->saved_data["gate"] = reinterpret_cast<int64_t>(gate);
    ctx->saved_data["event"] = event;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* gate = reinterpret_cast<UnitGate*>(ctx->saved_data.at("gate").toInt());
    gate->before_backward(static_cast<size_t>(ctx->saved_data.at("event").toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void UnitGate::begin_pass() {
  in_pass_ = true;
  events_.clear();
}

void UnitGate::end_pass() {
  if (in_pass_ && !recorded_) {
    order_ = events_;
    recorded_ = true;
  }
  in_pass_ = false;
  if (!pinned_) reducer_.free_all_units();
}

void UnitGate::pin() {
  pinned_ = true;
  reducer_.gather_all_units();
}

void UnitGate::unpin() {
  pinned_ = false;
  reducer_.free_all_units();
}

void UnitGate::enter(size_t unit) {
  if (pinned_) return;
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
  events_.push_back(unit);
  reducer_.gather_unit(unit);
  if (prefetch_ && recorded_ && pos + 1 < order_.size()) reducer_.prefetch_unit(order_[pos + 1]);
}

at::Tensor UnitGate::leave(size_t unit, const at::Tensor& x) {
  if (pinned_) return x;
  if (!in_pass_) {
    reducer_.free_unit(unit);
    return x;
  }
  // The event of this unit's latest enter.
  size_t event = events_.size();
  while (event > 0 && events_[event - 1] != unit) --event;
  if (event == 0) {
    throw std::logic_error(fmt::format("UnitGate: unit {} left without being entered", unit));
  }
  --event;
  const bool last = recorded_ && event + 1 == order_.size();
  if (reshard_after_forward_ && !last) reducer_.free_unit(unit);
  if (!x.requires_grad()) return x;
  return LeaveUnit::apply(x, this, static_cast<int64_t>(event));
}

void UnitGate::before_backward(size_t event) {
  if (pinned_ || event >= events_.size()) return;
  reducer_.gather_unit(events_[event]);
  if (prefetch_ && event > 0) reducer_.prefetch_unit(events_[event - 1]);
}

}  // namespace train
