// The Trainer's set-up: what the constructor runs, in order, before step 1. Persistent memory is
// allocated here (docs/DESIGN.md, "The OOM protocol"), so that a step can only run out of
// activation memory. Local allocations come first and are voted on before the first collective
// that needs them: a rank that runs out here must not leave the others waiting in a collective
// it never joins. Before them, the plan: does the state fit at all?
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <map>

#include "memory/memory_stats.h"
#include "models/capabilities.h"
#include "train/trainer.h"

namespace train {
namespace {

ddp::Communicator& shard_group_comm(ddp::ShardGroup group, ddp::Communicator& data,
                                    const HybridComms& hybrid) {
  if (group == ddp::ShardGroup::kWorld) return data;
  if (hybrid.node == nullptr || hybrid.cross_node == nullptr) {
    throw std::logic_error("ddp.shard_group: node needs the node and cross-node communicators");
  }
  return *hybrid.node;
}

}  // namespace

Trainer::Trainer(const TrainerOptions& options, ddp::Communicator& control, ddp::Communicator& data,
                 std::shared_ptr<models::Model> model, const data::Dataset& dataset,
                 c10::Device device, HybridComms hybrid)
    : options_(options), control_(control), data_(data),
      shard_comm_(shard_group_comm(options.ddp.shard_group, data, hybrid)),
      replicas_(hybrid.cross_node), model_(std::move(model)), dataset_(dataset), device_(device),
      precision_(options.train.precision), shard_(options.ddp.shard),
      micro_batch_(initial_micro_batch(options.train, control.size())),
      plan_(ddp::BatchPlan::make(options.train.global_batch_size, control.size(), control.rank(),
                                 options.train.micro_batch_size)),
      sampler_(dataset.size(), options.train.global_batch_size, options.train.seed) {
  plan_ = make_plan(options.train.micro_batch_size);
  check_state_fits();
  allocate_agreed("parameters, embedding caches and optimizer state",
                  [&] { allocate_model_state(); });
  nonfinite_injections_ = parse_nonfinite_injections(options_.train.inject_nonfinite);
  spike_injections_ = parse_spike_injections(options_.train.inject_spike);
  allocate_agreed("gradient buckets", [&] { allocate_gradients(); });
  estimate_.gradients += reducer_->gradient_bytes();
  // Last, so that it measures activations with everything persistent already in place.
  allocate_agreed("the loader's buffers and the activation probe", [&] { probe_activations(); });
  broadcast_model();
  if (shard_ == ddp::ShardMode::kParameters) shard_parameters_after_broadcast();
  choose_micro_batch();
  ladder_ = make_ladder();
  make_loader();
  // Eager warm-up steps before the first capture: lazy initialisation, cuDNN autotuning, and
  // the allocator's steady state.
  constexpr int64_t kGraphWarmupSteps = 3;
  graphs_ = std::make_unique<GraphStep>(options_.train.cuda_graphs, device_, kGraphWarmupSteps,
                                        control_.rank() == 0);
}

ddp::BatchPlan Trainer::make_plan(int64_t micro_batch) const {
  ddp::BatchPlan plan = ddp::BatchPlan::make(options_.train.global_batch_size, control_.size(),
                                             control_.rank(), micro_batch);
  if (shard_ == ddp::ShardMode::kParameters) plan.equalize_micro_batches(micro_batch);
  return plan;
}

int64_t Trainer::initial_micro_batch(const TrainOptions& t, int world) {
  const int64_t largest_slice = (t.global_batch_size + world - 1) / world;
  return t.micro_batch_size > 0 ? std::min(t.micro_batch_size, largest_slice) : largest_slice;
}

void Trainer::apply_channels_last() {
  const Switch cl = options_.train.channels_last;
  if (cl != Switch::kOn && !(cl == Switch::kAuto && device_.is_cuda())) return;
  auto* channels_last = models::as<models::ChannelsLast>(*model_);
  if (channels_last != nullptr) channels_last->set_channels_last(true);
  const bool applied = channels_last != nullptr;
  if (control_.rank() == 0 && applied) {
    spdlog::info("channels-last (NHWC) convolution weights and activations (train.channels_last "
                 "= {})",
                 kSwitchNames.at(static_cast<size_t>(cl)));
  } else if (control_.rank() == 0 && cl == Switch::kOn) {
    spdlog::warn("train.channels_last = on: this model does not convolve; ignored");
  }
}

void Trainer::allocate_model_state() {
  // Move by device only: Module::to(dtype) would also cast integer buffers (item texts).
  model_->to(device_);
  apply_channels_last();  // before the Reducer makes the gradients views with the parameters'
                          // strides
  auto state_bytes = [&] {
    int64_t bytes = 0;
    for (const auto& p : model_->parameters()) bytes += p.nbytes();
    for (const auto& b : model_->buffers()) bytes += b.nbytes();
    return bytes;
  };
  estimate_.parameters = state_bytes();
  if (auto* cache = models::as<models::EmbeddingCache>(*model_)) cache->build_cache();
  estimate_.caches = state_bytes() - estimate_.parameters;
  estimate_.other = std::max<int64_t>(
      0, memory::sample_memory(device_).tensor_bytes - estimate_.parameters - estimate_.caches);
  const auto& t = options_.train;
  // Sharded, the optimizer runs over the Reducer's blocks: it is made with the Reducer.
  if (shard_ == ddp::ShardMode::kNone) {
    optimizer_ = std::make_unique<FusedAdamW>(model_->parameters(),
                                              AdamWHyper{t.beta1, t.beta2, t.eps, t.weight_decay});
    estimate_.optimizer_state = optimizer_->state_bytes();
  }
  metrics_ = StepMetrics(device_);
  scaler_ = std::make_unique<LossScaler>(
      LossScalerOptions{precision_ == Precision::kFp16, t.loss_scale, t.loss_scale_growth,
                        t.loss_scale_backoff, t.loss_scale_interval},
      device_);
  if (t.skip_spikes.enabled()) guard_ = std::make_unique<SpikeGuard>(t.skip_spikes, device_);
}

void Trainer::allocate_gradients() {
  ddp::NamedParameters named;
  for (auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  const auto& d = options_.ddp;
  // The Reducer checks the parameter lists (collective, before this rank can fail) and then
  // only allocates.
  reducer_ = std::make_unique<ddp::Reducer>(
      std::move(named), shard_comm_,
      ddp::ReducerOptions{static_cast<int64_t>(d.first_bucket_mb * (1 << 20)),
                          static_cast<int64_t>(d.bucket_mb * (1 << 20)), d.find_unused_parameters,
                          reduce_wire_dtype(), shard_, parameter_units(), gather_dtype(),
                          /*rider_slots=*/guard_ != nullptr ? 1 : 0, replicas_},
      &control_);
  const bool sharded = reducer_->sharded();
  if (sharded) {
    optimizer_ = make_sharded_optimizer();
    estimate_.optimizer_state = optimizer_->state_bytes();
  }
  make_clipper(sharded);
}

void Trainer::make_clipper(bool sharded) {
  // Sharded: each rank holds distinct blocks of the gradients, and the squared norms are summed
  // over the world. Under hybrid sharding every node holds each block once, so the sum counts
  // each block once per node: it is divided by the replicas (the nodes). Over the world, not the
  // node, so that the spike guard's loss riding in the same all-reduce is the world's; one
  // mechanism with the guard or without (docs/DESIGN.md, "Hybrid sharding").
  const int64_t slots = guard_ != nullptr ? 1 : 0;
  const int replicas = replicas_ != nullptr ? replicas_->size() : 1;
  clipper_ = std::make_unique<GradClipper>(reducer_->reduced_gradients(),
                                           sharded ? &data_ : nullptr, slots, replicas);
  loss_rider_ = guard_ == nullptr ? at::Tensor() : sharded ? clipper_->rider() : reducer_->rider();
}

std::vector<std::vector<size_t>> Trainer::parameter_units() {
  std::vector<std::vector<size_t>> units;
  auto* declared = models::as<models::ParameterUnits>(*model_);
  if (shard_ != ddp::ShardMode::kParameters || declared == nullptr) return units;
  std::map<std::string, size_t> index;
  for (const auto& item : model_->named_parameters()) index.emplace(item.key(), index.size());
  for (const auto& names : declared->parameter_units()) {
    auto& unit = units.emplace_back();
    for (const auto& name : names) unit.push_back(index.at(name));
  }
  return units;
}

void Trainer::shard_parameters_after_broadcast() {
  // Every rank holds the whole model (rank 0's, just broadcast): each keeps its blocks only.
  reducer_->reshard_parameters();
  gate_ = std::make_unique<UnitGate>(*reducer_, options_.ddp.reshard_after_forward,
                                     options_.ddp.prefetch_units);
  auto* declared = models::as<models::ParameterUnits>(*model_);
  model_has_units_ = declared != nullptr;
  if (declared != nullptr) declared->set_unit_gate(gate_.get());
  int64_t masters = 0;
  for (const auto& m : reducer_->parameter_shards()) masters += m.nbytes();
  int64_t buffers = 0;
  for (const auto& b : model_->buffers()) buffers += b.nbytes();
  // Between steps a rank keeps its blocks; in a step at most two units are gathered.
  estimate_.parameters = masters + 2 * reducer_->largest_unit_bytes() + buffers;
}

std::unique_ptr<PinnedUnits> Trainer::pin_parameters() {
  return gate_ != nullptr ? std::make_unique<PinnedUnits>(gate_.get()) : nullptr;
}

void Trainer::make_loader() {
  // The loader reads this rank's slice of each step; the slice (offset, size) never changes with
  // the micro-batch, so a fallback keeps reading the same samples.
  data::LoaderOptions loader = options_.loader;
  loader.pin_memory = device_.is_cuda();
  const int64_t offset = plan_.offset, per_rank = plan_.per_rank;
  loader_ = std::make_unique<data::Loader>(
      dataset_,
      [this, offset, per_rank](int64_t batch) { return sampler_.indices(batch, offset, per_rank); },
      loader);
}

c10::ScalarType Trainer::reduce_wire_dtype() const {
  return options_.ddp.reduce_dtype == ddp::ReduceDtype::kBf16 ? at::kBFloat16
                                                              : c10::ScalarType::Undefined;
}

c10::ScalarType Trainer::gather_dtype() const {
  // ddp.shard: parameters gathers the units in the compute dtype (the masters stay fp32).
  if (precision_ == Precision::kBf16) return at::kBFloat16;
  if (precision_ == Precision::kFp16) return at::kHalf;
  return c10::ScalarType::Undefined;
}

std::unique_ptr<FusedAdamW> Trainer::make_sharded_optimizer() const {
  const auto& t = options_.train;
  return std::make_unique<FusedAdamW>(reducer_->parameter_shards(),
                                      AdamWHyper{t.beta1, t.beta2, t.eps, t.weight_decay},
                                      reducer_->reduced_gradients());
}

void Trainer::broadcast_model() {
  at::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) {
    data_.broadcast(item.value().data(), 0, "parameter " + item.key());
  }
  for (auto& item : model_->named_buffers())
    data_.broadcast(item.value(), 0, "buffer " + item.key());
}

}  // namespace train
