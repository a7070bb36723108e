#include "models/deferred_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <mutex>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace models {
namespace {

thread_local DeferredInit* tls_scope = nullptr;

at::Tensor generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

DeferredInit::DeferredInit(c10::Device device) : record_(std::make_shared<DeferredRecord>()) {
  if (tls_scope != nullptr) throw std::logic_error("DeferredInit: scopes do not nest");
  record_->device = device;
  record_->generator_state = generator_state();
  tls_scope = this;
}

DeferredInit::~DeferredInit() {
  if (tls_scope == this) tls_scope = nullptr;
}

DeferredInit* DeferredInit::current() { return tls_scope; }

std::shared_ptr<DeferredRecord> DeferredInit::finish(torch::nn::Module& model) {
  tls_scope = nullptr;
  bool draws = false;
  for (const auto& init : record_->inits) draws = draws || init.random;
  if (draws && !at::equal(generator_state(), record_->generator_state)) {
    throw std::logic_error("DeferredInit: the model drew random numbers while built without "
                           "storage, so its deferred draws cannot be replayed in order");
  }
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& p = item.value();
    if (holds_no_storage(p) || p.numel() == 0) continue;
    // Allocated for real inside the scope: its values, kept apart from the Variable (which the
    // Reducer later points elsewhere).
    const at::Tensor values = p.detach();
    record_->inits.push_back(
        {p, [values](const at::Tensor& into) { into.copy_(values); }, /*random=*/false});
  }
  return record_;
}

at::Tensor tensor_without_storage(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

bool holds_no_storage(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.storage().nbytes() == 0;
}

at::Tensor new_parameter(at::IntArrayRef shape) {
  DeferredInit* scope = DeferredInit::current();
  if (scope == nullptr) return at::empty(shape);
  return tensor_without_storage(shape, at::TensorOptions().device(scope->record().device));
}

void init_parameter(const at::Tensor& parameter, std::function<void(const at::Tensor&)> fill,
                    bool random) {
  DeferredInit* scope = DeferredInit::current();
  if (scope != nullptr && holds_no_storage(parameter)) {
    scope->record().inits.push_back({parameter, std::move(fill), random});
    return;
  }
  at::NoGradGuard no_grad;
  fill(parameter);
}

namespace {

// The walk of materialise_units over a record (see deferred_init.h).
class Walk {
 public:
  Walk(const DeferredRecord& record, const std::vector<std::vector<at::Tensor>>& units)
      : record_(record), unit_(record.inits.size()), slot_(record.inits.size()),
        last_(units.size(), -1), pending_(units.size()) {
    std::unordered_map<const void*, std::pair<size_t, size_t>> where;
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t j = 0; j < units[u].size(); ++j) {
        where[units[u][j].unsafeGetTensorImpl()] = {u, j};
      }
    }
    std::vector<std::vector<char>> has(units.size());
    for (size_t u = 0; u < units.size(); ++u) has[u].assign(units[u].size(), 0);
    for (size_t k = 0; k < record.inits.size(); ++k) {
      const auto it = where.find(record.inits[k].parameter.unsafeGetTensorImpl());
      if (it == where.end()) {
        throw std::logic_error("deferred initialisation: a recorded parameter is in no unit");
      }
      std::tie(unit_[k], slot_[k]) = it->second;
      last_[unit_[k]] = static_cast<int64_t>(k);
      has[unit_[k]][slot_[k]] = 1;
    }
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t j = 0; j < units[u].size(); ++j) {
        if (!has[u][j]) {
          throw std::logic_error(fmt::format(
              "deferred initialisation: parameter #{} of unit {} has no recorded initialisation", j,
              u));
        }
      }
    }
  }

  void run(const std::function<std::vector<at::Tensor>(size_t)>& open,
           const std::function<void(size_t)>& close) {
    set_generator_state(record_.generator_state);
    at::NoGradGuard no_grad;
    std::vector<char> done(last_.size(), 0);
    const auto begin = [&](size_t u) {
      open_ = true;
      open_unit_ = u;
      into_ = open(u);
      replay_pending(u);
    };
    const auto end = [&](size_t u) {
      close(u);
      done[u] = 1;
      open_ = false;
      into_.clear();
    };
    for (size_t k = 0; k < record_.inits.size(); ++k) {
      const size_t u = unit_[k];
      if (!open_ && !done[u] && contiguous_from(k)) begin(u);
      const bool mine = open_ && open_unit_ == u;
      if (mine) {
        apply(k, into_[slot_[k]]);
      } else {
        pass(k);
      }
      if (mine && static_cast<int64_t>(k) == last_[u]) end(u);
    }
    // A unit whose last initialisation (one that draws nothing) came while another was open.
    for (size_t u = 0; u < done.size(); ++u) {
      if (done[u]) continue;
      begin(u);
      end(u);
    }
  }

 private:
  // Whether unit_[k]'s draws from k on come before any other unit's next draw.
  bool contiguous_from(size_t k) const {
    const size_t u = unit_[k];
    for (size_t i = k + 1; static_cast<int64_t>(i) <= last_[u]; ++i) {
      if (unit_[i] != u && record_.inits[i].random) return false;
    }
    return true;
  }

  // A unit not open yet: its draws advance the generator into a scratch tensor, from the state
  // kept for its real turn.
  void pass(size_t k) {
    const DeferredRecord::Init& init = record_.inits[k];
    pending_[unit_[k]].push_back({k, init.random ? generator_state() : at::Tensor()});
    if (init.random) init.fill(at::empty(init.parameter.sizes()));
  }

  // The inits of `u` passed before it opened, in order, each from its kept state.
  void replay_pending(size_t u) {
    if (pending_[u].empty()) return;
    const at::Tensor live = generator_state();
    for (const auto& [k, state] : pending_[u]) {
      if (state.defined()) set_generator_state(state);
      apply(k, into_[slot_[k]]);
    }
    set_generator_state(live);
    pending_[u].clear();
  }

  void apply(size_t k, const at::Tensor& out) const {
    // On a CPU tensor of the parameter's shape, as the constructor drew.
    const bool direct = out.device().is_cpu() && out.is_contiguous();
    const at::Tensor target = direct ? out : out.to(at::kCPU).contiguous();
    record_.inits[k].fill(target);
    if (!direct) out.copy_(target);
  }

  const DeferredRecord& record_;
  std::vector<size_t> unit_, slot_;  // init -> its unit, its index there
  std::vector<int64_t> last_;        // unit -> its last init (-1: none)
  std::vector<std::vector<std::pair<size_t, at::Tensor>>> pending_;  // passed inits, their state
  bool open_ = false;
  size_t open_unit_ = 0;
  std::vector<at::Tensor> into_;
};

}  // namespace

void materialise_units(const DeferredRecord& record,
                       const std::vector<std::vector<at::Tensor>>& units,
                       const std::function<std::vector<at::Tensor>(size_t unit)>& open,
                       const std::function<void(size_t unit)>& close) {
  Walk(record, units).run(open, close);
}

}  // namespace models
