// The Trainer's set-up: what the constructor runs, in order, before step 1. Persistent memory is
// allocated here (docs/DESIGN.md, "The OOM protocol"), so that a step can only run out of
// activation memory. Local allocations come first and are voted on before the first collective
// that needs them: a rank that runs out here must not leave the others waiting in a collective
// it never joins. Before them, the plan: does the state fit at all?
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "models/capabilities.h"
#include "models/deferred_init.h"
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

// Eager warm-up steps before the first capture: lazy initialisation, cuDNN autotuning, and the
// allocator's steady state.
constexpr int64_t kGraphWarmupSteps = 3;

}  // namespace

Trainer::Trainer(const TrainerOptions& options, ddp::Communicator& control, ddp::Communicator& data,
                 std::shared_ptr<models::Model> model, const data::Dataset& dataset,
                 c10::Device device, HybridComms hybrid)
    : options_(options), placement_{control, data,
                                    shard_group_comm(options.ddp.shard_group, data, hybrid),
                                    hybrid.cross_node, device},
      model_(std::move(model)), objective_(options_.train, *model_),
      batches_(dataset, options_.train, options_.loader, control.size(), control.rank(), device),
      memory_(options_, placement_), state_(options_, placement_, *model_, objective_.forwards()),
      schedule_(options_.train) {
  // Packed documents need a model that attends within them: a user error (data.packing), the
  // same on every rank, before any collective.
  if (batches_.packed()) static_cast<void>(models::packed_documents(*model_));
  const ddp::ShardMode mode = state_.configured_shard();
  // A generated sample runs forwards one at a time, where the unit order of a pass with the
  // adapters-off reference lists two (train/objective.h): not supported together.
  if (objective_.forwards() > 1 && mode == ddp::ShardMode::kParameters &&
      options_.train.sample_every > 0) {
    throw std::invalid_argument(
        "train.sample_every: not supported with train.objective: dpo over LoRA adapters under "
        "ddp.shard: parameters (set train.sample_every: 0, or another ddp.shard)");
  }
  batches_.plan_configured(mode == ddp::ShardMode::kParameters);
  memory_.check_state_fits(*model_, mode);
  memory_.allocate_agreed("parameters, embedding caches and optimizer state",
                          [&] { allocate_model_state(); });
  injections_ = {parse_nonfinite_injections(options_.train.inject_nonfinite),
                 parse_spike_injections(options_.train.inject_spike)};
  memory_.allocate_agreed("gradient buckets", [&] { allocate_gradients(); });
  // A model built without storage (ddp.shard: parameters): each rank fills its blocks unit by
  // unit, here, so that the probe below runs through the unit gate (docs/DESIGN.md, "Parameters
  // sharded"). A file that cannot be read is voted on too.
  if (state_.deferred()) {
    memory_.allocate_agreed(
        "the parameters, unit by unit", [&] { state_.materialise_deferred(); },
        /*vote_errors=*/true);
  }
  // Last, so that it measures activations with everything persistent already in place.
  memory_.allocate_agreed("the loader's buffers and the activation probe", [&] {
    memory_.probe_activations(*model_, state_.reducer(), batches_, state_.gate(), &objective_);
  });
  broadcast_model();
  finish_setup();
  graphs_ = std::make_unique<GraphStep>(options_.train.cuda_graphs, device, kGraphWarmupSteps,
                                        control.rank() == 0);
}

void Trainer::apply_channels_last() {
  const Switch cl = options_.train.channels_last;
  if (cl != Switch::kOn && !(cl == Switch::kAuto && placement_.device.is_cuda())) return;
  auto* channels_last = models::as<models::ChannelsLast>(*model_);
  if (channels_last != nullptr) channels_last->set_channels_last(true);
  const bool applied = channels_last != nullptr;
  if (placement_.rank() == 0 && applied) {
    spdlog::info("channels-last (NHWC) convolution weights and activations (train.channels_last "
                 "= {})",
                 kSwitchNames.at(static_cast<size_t>(cl)));
  } else if (placement_.rank() == 0 && cl == Switch::kOn) {
    spdlog::warn("train.channels_last = on: this model does not convolve; ignored");
  }
}

void Trainer::allocate_model_state() {
  // Move by device only: Module::to(dtype) would also cast integer buffers (item texts).
  model_->to(placement_.device);
  apply_channels_last();  // before the Reducer makes the gradients views with the parameters'
                          // strides
  memory_.count_model_state(*model_, [&] {
    if (auto* cache = models::as<models::EmbeddingCache>(*model_)) cache->build_cache();
  });
  const auto& t = options_.train;
  const c10::Device device = placement_.device;
  // Sharded, the optimizer runs over the Reducer's blocks: it is made with the Reducer.
  if (state_.configured_shard() == ddp::ShardMode::kNone) {
    state_.allocate_optimizer();
    memory_.estimate().optimizer_state = state_.optimizer().state_bytes();
  }
  std::vector<std::string> names;
  for (int64_t i = 0; i < objective_.metrics(); ++i) names.emplace_back(kPreferenceMetrics[i]);
  metrics_ = StepMetrics(device, std::move(names));
  allocate_reference();
  scaler_ = std::make_unique<LossScaler>(
      LossScalerOptions{t.precision == Precision::kFp16, t.loss_scale, t.loss_scale_growth,
                        t.loss_scale_backoff, t.loss_scale_interval},
      device);
  if (t.skip_spikes.enabled()) guard_ = std::make_unique<SpikeGuard>(t.skip_spikes, device);
}

void Trainer::allocate_reference() {
  if (objective_.reference() != ReferenceKind::kPrecomputed) return;
  const auto validation = batches_.dataset().validation();
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(placement_.device);
  objective_.set_reference(
      at::zeros({batches_.dataset().size(), 2}, f64),
      validation != nullptr ? at::zeros({validation->size(), 2}, f64) : at::Tensor());
}

void Trainer::allocate_gradients() {
  state_.allocate_gradients();
  memory::MemoryEstimate& e = memory_.estimate();
  // Sharded, AdamW is made with the Reducer; Muon always is (its buffers join the state).
  e.optimizer_state = state_.optimizer_bytes();
  e.gradients += state_.reducer().gradient_bytes();
}

void Trainer::broadcast_model() {
  at::NoGradGuard no_grad;
  // A deferred build: every rank materialised (or read) the same values into its blocks.
  for (auto& item : model_->named_parameters()) {
    if (state_.deferred()) break;
    placement_.data.broadcast(item.value().data(), 0, "parameter " + item.key());
  }
  // A deferred build's frozen base (LoRA) holds no storage: every rank filled its blocks alike.
  for (auto& item : model_->named_buffers()) {
    if (state_.deferred() && models::holds_no_storage(item.value())) continue;
    placement_.data.broadcast(item.value(), 0, "buffer " + item.key());
  }
}

void Trainer::finish_setup() {
  const bool units = state_.shard_mode() == ddp::ShardMode::kParameters;
  if (units) {
    if (!state_.deferred()) state_.shard_parameters_after_broadcast();
    memory_.count_parameter_shards(*model_, state_.reducer());
  }
  if (options_.train.micro_batch_size <= 0) {  // auto: the largest that fits every rank
    batches_.set_micro_batch(memory_.choose_micro_batch(batches_.micro_batch()), units);
  }
  // Note [A bounded shard write]: an asynchronous checkpoint's copy that does not fit the plan.
  if (units && !memory_.checkpoint_copy_fits(batches_.micro_batch()))
    options_.checkpoint.async = false;
  fallbacks_ = std::make_unique<Fallbacks>(
      options_.memory, RungTargets{*model_, batches_, state_, memory_, placement_});
  batches_.start();
}

void Trainer::set_steps_done(int64_t steps) { state_.optimizer().set_steps(steps); }

checkpoint::RunState Trainer::run_state() {
  checkpoint::RunState state = state_.run_state();
  state.schedule = Schedule::to_text(schedule_.plan());
  state.resume_schedule = [this](int64_t steps_done, const std::string& plan) {
    schedule_.resume(steps_done, Schedule::from_text(plan));
  };
  return state;
}

}  // namespace train
