#include "train/model_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "models/capabilities.h"
#include "models/deferred_init.h"

namespace train {
namespace {

// The step's global loss rides in one float (docs/DESIGN.md, "No host synchronisation in the
// step"): always, so that every run's collectives carry the same payloads, guard or not.
constexpr int64_t kRiderSlots = 1;

AdamWHyper adamw_hyper(const TrainOptions& t) {
  return AdamWHyper{t.beta1, t.beta2, t.eps, t.weight_decay};
}

}  // namespace

ModelState::ModelState(const TrainerOptions& options, const Placement& placement,
                       models::Model& model, int forwards)
    : options_(options), placement_(placement), model_(model), forwards_(forwards) {
  if (options_.train.optimizer == OptimizerKind::kMuon) targets_ = muon_targets(model_);
}

void ModelState::allocate_optimizer() {
  optimizer_ = std::make_unique<FusedAdamW>(model_.parameters(), adamw_hyper(options_.train),
                                            std::vector<at::Tensor>{}, adamw_updates(false));
}

std::vector<ElementRanges> ModelState::adamw_updates(bool sharded) const {
  std::vector<ElementRanges> updates;
  const std::vector<bool>& hidden = targets_.params;
  if (hidden.empty()) return updates;  // adamw: every element
  const auto params = model_.parameters();
  if (!sharded) {
    for (size_t k = 0; k < hidden.size(); ++k) {
      updates.push_back(hidden[k] ? ElementRanges{} : ElementRanges{{0, params[k].numel()}});
    }
    return updates;
  }
  // Sharded: each block less the elements of the hidden matrices in it.
  const auto& layout = reducer_->layout();
  const auto shards = reducer_->shards();
  for (size_t b = 0; b < layout.size(); ++b) {
    const ddp::BucketShard& shard = shards[b];
    ElementRanges& ranges = updates.emplace_back();
    int64_t from = 0;
    for (size_t j = 0; j < layout[b].params.size(); ++j) {
      if (!hidden[layout[b].params[j]]) continue;
      const int64_t numel = params[layout[b].params[j]].numel();
      const auto [first, last] = shard.owned(layout[b].offsets[j], numel);
      if (first >= last) continue;
      ranges.emplace_back(from, first - shard.begin);
      from = last - shard.begin;
    }
    ranges.emplace_back(from, shard.size);
  }
  return updates;
}

void ModelState::make_muon() {
  muon_.reset();
  if (targets_.params.empty()) return;
  MuonPlan plan = plan_muon(reducer_->layout(), parameter_shapes(model_), targets_.matrices,
                            placement_.shard.size(), options_.train.muon.ns_steps);
  std::vector<MuonPiece> pieces;
  const auto params = model_.parameters();
  if (!reducer_->sharded()) {  // every rank holds every matrix whole
    for (size_t i = 0; i < plan.matrices.size(); ++i) {
      const MuonMatrix& m = plan.matrices[i];
      const at::Tensor& p = params[m.param];
      const auto part = [&m](const at::Tensor& t) {
        return t.view({-1}).narrow(0, m.begin, m.numel());
      };
      pieces.push_back({i, 0, part(p), part(p.grad()), part(optimizer_->exp_avgs()[m.param])});
    }
  } else {  // this rank's blocks
    const auto& layout = reducer_->layout();
    const auto shards = reducer_->shards();
    const auto blocks = reducer_->parameter_shards();
    const auto grads = reducer_->reduced_gradients();
    for (size_t i = 0; i < plan.matrices.size(); ++i) {
      const MuonMatrix& m = plan.matrices[i];
      const size_t b = plan.chunks[m.chunk].bucket;
      const auto& params_of = layout[b].params;
      const size_t j = std::find(params_of.begin(), params_of.end(), m.param) - params_of.begin();
      const int64_t start = layout[b].offsets.at(j) + m.begin;  // in the bucket
      const auto [first, last] = shards[b].owned(start, m.numel());
      if (first >= last) continue;
      const int64_t at = first - shards[b].begin, n = last - first;
      pieces.push_back({i, first - start, blocks[b].narrow(0, at, n), grads[b].narrow(0, at, n),
                        optimizer_->exp_avgs()[b].narrow(0, at, n)});
    }
  }
  if (!muon_logged_ && placement_.rank() == 0) {
    spdlog::info("muon: {}", plan.describe(muon_ns_dtype(options_.train)));
  }
  muon_logged_ = true;
  muon_ = std::make_unique<Muon>(std::move(plan), std::move(pieces), options_.train.muon,
                                 muon_ns_dtype(options_.train), reducer_->sharded(),
                                 placement_.shard, placement_.device);
}

void ModelState::step(double factor, const at::Tensor& found_inf) {
  optimizer_->step(options_.train.lr * factor, &found_inf);
  if (muon_ != nullptr) muon_->step(options_.train.muon.lr * factor, found_inf);
}

int64_t ModelState::optimizer_bytes() const {
  return optimizer_->state_bytes() + (muon_ != nullptr ? muon_->state_bytes() : 0);
}

void ModelState::allocate_gradients(ddp::ShardMode mode) {
  ddp::NamedParameters named;
  for (auto& item : model_.named_parameters()) named.emplace_back(item.key(), item.value());
  const auto& d = options_.ddp;
  // The Reducer checks the parameter lists (collective, before this rank can fail) and then
  // only allocates.
  reducer_ = std::make_unique<ddp::Reducer>(
      std::move(named), placement_.shard,
      ddp::ReducerOptions{.first_bucket_bytes = static_cast<int64_t>(d.first_bucket_mb * (1 << 20)),
                          .bucket_bytes = static_cast<int64_t>(d.bucket_mb * (1 << 20)),
                          .find_unused_parameters = d.find_unused_parameters,
                          .reduce_dtype = reduce_wire_dtype(),
                          .shard = mode,
                          .units = parameter_units(mode),
                          .gather_dtype = gather_dtype(),
                          .rider_slots = kRiderSlots,
                          .replicas = placement_.replicas,
                          .deferred = deferred(),
                          .frozen = frozen_units(mode)},
      &placement_.control);
  if (reducer_->sharded()) optimizer_ = make_sharded_optimizer();
  make_clipper();
  make_muon();
}

void ModelState::make_clipper() {
  // Sharded: each rank holds distinct blocks of the gradients, and the squared norms are summed
  // over the world. Under hybrid sharding every node holds each block once, so the sum counts
  // each block once per node: it is divided by the replicas (the nodes). Over the world, not the
  // node, so that the loss riding in the same all-reduce is the world's (docs/DESIGN.md, "Hybrid
  // sharding").
  const bool sharded = reducer_->sharded();
  const int replicas = placement_.replicas != nullptr ? placement_.replicas->size() : 1;
  clipper_ = std::make_unique<GradClipper>(reducer_->reduced_gradients(),
                                           sharded ? &placement_.data : nullptr,
                                           sharded ? kRiderSlots : 0, replicas);
}

const at::Tensor& ModelState::loss_rider() const {
  return reducer_->sharded() ? clipper_->rider() : reducer_->rider();
}

std::vector<std::vector<size_t>> ModelState::parameter_units(ddp::ShardMode mode) const {
  std::vector<std::vector<size_t>> units;
  auto* declared = models::as<models::ParameterUnits>(model_);
  if (mode != ddp::ShardMode::kParameters || declared == nullptr) return units;
  std::map<std::string, size_t> index;
  for (const auto& item : model_.named_parameters()) index.emplace(item.key(), index.size());
  for (const auto& names : declared->parameter_units()) {
    auto& unit = units.emplace_back();
    for (const auto& name : names) unit.push_back(index.at(name));
  }
  return units;
}

std::vector<ddp::NamedParameters> ModelState::frozen_units(ddp::ShardMode mode) const {
  if (mode != ddp::ShardMode::kParameters) return {};
  return models::frozen_unit_buffers(model_);
}

bool ModelState::model_has_units() const {
  return models::as<models::ParameterUnits>(model_) != nullptr;
}

void ModelState::shard_parameters_after_broadcast() {
  // Every rank holds the whole model (rank 0's, just broadcast): each keeps its blocks only.
  reducer_->reshard_parameters();
  install_gate();
}

void ModelState::install_gate() {
  auto* declared = models::as<models::ParameterUnits>(model_);
  // A model without units is one unit, entered once per forward.
  std::vector<size_t> order = declared != nullptr ? declared->unit_order() : std::vector<size_t>{0};
  // Each forward of a pass enters the units in the model's order (a reference forward after the
  // policy's: train/objective.h).
  if (declared != nullptr) {
    const std::vector<size_t> one = order;
    for (int f = 1; f < forwards_; ++f) order.insert(order.end(), one.begin(), one.end());
  }
  gate_ = std::make_unique<UnitGatherer>(*reducer_, options_.ddp.reshard_after_forward,
                                         options_.ddp.prefetch_units, std::move(order));
  if (declared != nullptr) declared->set_unit_gate(gate_.get());
}

ddp::ShardMode ModelState::configured_shard() const { return options_.ddp.shard; }

bool ModelState::deferred() const { return model_.deferred_init() != nullptr; }

void ModelState::materialise_deferred() {
  const models::DeferredRecord& record = *model_.deferred_init();
  // With a frozen base (LoRA) the adapters take their recorded initialisations, whose draws
  // follow the base's: every unit is replayed, then the base read over its blocks.
  const bool frozen = reducer_->holds_frozen();
  if (record.read && !frozen) {
    read_master_blocks(record.read);
  } else {
    replay_initialisation(record);
  }
  if (record.read && frozen) read_frozen_blocks(record.read);
  if (record.read_adapters) read_master_blocks(record.read_adapters);  // model.lora_init_from
  reducer_->masters_filled();
  install_gate();
}

void ModelState::replay_initialisation(const models::DeferredRecord& record) {
  // Each unit whole in host memory, one at a time: the same draws as the model built whole. A
  // unit's frozen tensors (LoRA's base) follow its parameters, in a host buffer of their own.
  const auto named = model_.named_parameters();
  const auto& layout = reducer_->layout();
  const auto shards = reducer_->shards();
  const std::vector<at::Tensor> masters = reducer_->parameter_shards();
  std::vector<std::vector<at::Tensor>> units(reducer_->units());
  for (size_t u = 0; u < units.size(); ++u) {
    for (const size_t k : layout[reducer_->unit_bucket(u)].params) {
      units[u].push_back(named[k].value());
    }
    for (const auto& [name, t] : reducer_->frozen(u).tensors) units[u].push_back(t);
  }
  at::Tensor host, host_frozen;  // the open unit, flat and padded as its buckets
  const auto views_into = [](const at::Tensor& flat, const ddp::BucketLayout& b,
                             const auto& tensor_of, std::vector<at::Tensor>& views) {
    for (size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& p = tensor_of(b.params[j]);
      views.push_back(flat.narrow(0, b.offsets[j], p.numel()).view(p.sizes()));
    }
  };
  const auto open = [&](size_t u) {
    const size_t b = reducer_->unit_bucket(u);
    std::vector<at::Tensor> views;
    host = at::zeros({shards[b].padded}, at::kFloat);
    views_into(
        host, layout[b], [&](size_t k) { return named[k].value(); }, views);
    const ddp::Reducer::Frozen& f = reducer_->frozen(u);
    if (f.full.defined()) {
      host_frozen = at::zeros({f.shard.padded}, at::kFloat);
      views_into(
          host_frozen, f.layout, [&](size_t k) { return f.tensors[k].second; }, views);
    }
    return views;
  };
  const auto close = [&](size_t u) {
    const size_t b = reducer_->unit_bucket(u);
    masters[b].copy_(host.narrow(0, shards[b].begin, shards[b].size));
    const ddp::Reducer::Frozen& f = reducer_->frozen(u);
    if (f.full.defined()) f.master.copy_(host_frozen.narrow(0, f.shard.begin, f.shard.size));
    host = at::Tensor();
    host_frozen = at::Tensor();
  };
  models::materialise_units(record, units, open, close);
}

namespace {

// This rank's elements of each of `layout`'s tensors (named by `name_of`), read into its block
// `master` of geometry `shard`: nothing else is read or held.
void read_block(const models::ParameterReader& read, const ddp::BucketLayout& layout,
                const ddp::BucketShard& shard, const at::Tensor& master,
                const std::function<std::pair<std::string, int64_t>(size_t)>& name_of) {
  const bool direct = master.device().is_cpu() && master.scalar_type() == at::kFloat;
  at::Tensor host = direct ? master : at::zeros({shard.size}, at::kFloat);
  for (size_t j = 0; j < layout.params.size(); ++j) {
    const auto [name, numel] = name_of(layout.params[j]);
    const int64_t offset = layout.offsets[j];
    const auto [first, last] = shard.owned(offset, numel);
    if (first < last) read(name, first - offset, host.narrow(0, first - shard.begin, last - first));
  }
  if (!direct) master.copy_(host);
}

}  // namespace

void ModelState::read_master_blocks(const models::ParameterReader& read) {
  const auto named = model_.named_parameters();
  const auto& layout = reducer_->layout();
  const auto shards = reducer_->shards();
  const std::vector<at::Tensor> masters = reducer_->parameter_shards();
  for (size_t b = 0; b < layout.size(); ++b) {
    read_block(read, layout[b], shards[b], masters[b], [&](size_t k) {
      return std::pair{named[k].key(), named[k].value().numel()};
    });
  }
}

void ModelState::read_frozen_blocks(const models::ParameterReader& read) {
  for (size_t u = 0; u < reducer_->units(); ++u) {
    const ddp::Reducer::Frozen& f = reducer_->frozen(u);
    if (!f.full.defined()) continue;
    read_block(read, f.layout, f.shard, f.master, [&](size_t k) {
      return std::pair{f.tensors[k].first, f.tensors[k].second.numel()};
    });
  }
}

std::unique_ptr<PinnedUnits> ModelState::pin(bool frozen) {
  return gate_ != nullptr ? std::make_unique<PinnedUnits>(gate_.get(), frozen) : nullptr;
}

std::unique_ptr<LockstepUnits> ModelState::units_in_step() {
  if (gate_ == nullptr) return nullptr;
  return std::make_unique<LockstepUnits>(gate_.get(), model_has_units());
}

checkpoint::RunState ModelState::run_state() {
  checkpoint::RunState state;
  state.model = &model_;
  state.reducer = reducer_.get();
  state.exp_avgs = optimizer_->exp_avgs();
  state.exp_avg_sqs = optimizer_->exp_avg_sqs();
  state.muon = targets_.params;
  if (gate_ != nullptr) {
    // A checkpoint saves no frozen tensor (models::FrozenBase): LoRA's base stays sharded.
    state.gather_units = [this]() -> std::shared_ptr<void> { return pin(/*frozen=*/false); };
  }
  state.parameter_blocks = deferred();
  return state;
}

c10::ScalarType ModelState::reduce_wire_dtype() const {
  return options_.ddp.reduce_dtype == ddp::ReduceDtype::kBf16 ? at::kBFloat16
                                                              : c10::ScalarType::Undefined;
}

c10::ScalarType ModelState::gather_dtype() const {
  // ddp.shard: parameters gathers the units in the compute dtype (the masters stay fp32).
  const Precision precision = options_.train.precision;
  if (precision == Precision::kBf16) return at::kBFloat16;
  if (precision == Precision::kFp16) return at::kHalf;
  return c10::ScalarType::Undefined;
}

std::unique_ptr<FusedAdamW> ModelState::make_sharded_optimizer() const {
  return std::make_unique<FusedAdamW>(reducer_->parameter_shards(), adamw_hyper(options_.train),
                                      reducer_->reduced_gradients(), adamw_updates(true));
}

void ModelState::restore_moments(std::vector<at::Tensor> m, std::vector<at::Tensor> v,
                                 int64_t steps, const at::Tensor& count) {
  for (size_t b = 0; b < m.size(); ++b) {
    optimizer_->exp_avgs()[b].copy_(m[b]);
    optimizer_->exp_avg_sqs()[b].copy_(v[b]);
  }
  optimizer_->set_steps(steps);
  optimizer_->step_count().copy_(count);
}

void ModelState::shard_optimizer_in_place() {
  // Every rank holds the same replicated moments: each slices out its own blocks, with no
  // collective, before the full moments go, and only then do the buckets and parameters change.
  // The order keeps the extra memory to this rank's blocks (the full moments are freed first).
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> m = reducer_->blocks_of(optimizer_->exp_avgs());
  std::vector<at::Tensor> v = reducer_->blocks_of(optimizer_->exp_avg_sqs());
  const int64_t steps = optimizer_->steps();
  const at::Tensor count = optimizer_->step_count().clone();
  muon_.reset();
  optimizer_.reset();
  clipper_.reset();
  reducer_->shard_in_place(ddp::ShardMode::kOptimizer);
  optimizer_ = make_sharded_optimizer();
  restore_moments(std::move(m), std::move(v), steps, count);
  make_clipper();
  make_muon();  // over the blocks, its momentum among the moments just sliced
}

void ModelState::shard_parameters_in_place() {
  // Every rank holds the same parameters; the moments are full on every rank (replicated, or
  // gathered from the blocks: collective), sliced into the new blocks, then the full ones go.
  at::NoGradGuard no_grad;
  const bool sharded = reducer_->sharded();
  std::vector<at::Tensor> m =
      sharded ? reducer_->unshard(optimizer_->exp_avgs(), -1) : optimizer_->exp_avgs();
  std::vector<at::Tensor> v =
      sharded ? reducer_->unshard(optimizer_->exp_avg_sqs(), -1) : optimizer_->exp_avg_sqs();
  const int64_t steps = optimizer_->steps();
  const at::Tensor count = optimizer_->step_count().clone();
  muon_.reset();
  optimizer_.reset();
  clipper_.reset();
  reducer_.reset();
  for (auto& p : model_.parameters()) p.mutable_grad() = at::Tensor();
  // The Reducer over the units (its check is collective), the optimizer.
  allocate_gradients(ddp::ShardMode::kParameters);
  restore_moments(reducer_->blocks_of(m), reducer_->blocks_of(v), steps, count);
  // The parameters are the same on every rank: no broadcast before each keeps its blocks.
  shard_parameters_after_broadcast();
}

}  // namespace train
