// ModelState: the model's training state on this rank under the ddp.shard mode in force: the
// Reducer's flat gradient buckets (and, sharded, this rank's blocks of the parameters), AdamW
// over them (train.optimizer: muon: over every parameter but the hidden matrices, which Muon
// updates: train/muon.h), the gradient clipper, and under ddp.shard: parameters the unit gate
// that gathers and frees the model unit by unit (docs/DESIGN.md, "One step, eager"). Muon keeps
// its momentum in AdamW's first moments, so every change of mode below carries it along with
// them, and Muon is made anew over the new layout after each.
//
// The shard modes have one owner, asked by the rest of train/: configured_shard() (ddp.shard as
// configured, which the first Reducer takes and checkpoint.format: auto follows) and shard_mode()
// (the mode in force: the Reducer's, which the rungs that shard a run in place change). Whether
// the model was built without storage is decided once, by the launcher (builds_deferred in
// launcher/startup.cpp); the model carries the answer (models::Model::deferred_init()), and
// deferred() reads it.
//
// Where the step's global loss rides (loss_rider()): a collective the step already makes carries
// one more float that sums every rank's loss: the first bucket's all-reduce when the gradients
// are replicated, the gradient norm's all-reduce when they are sharded. It rides whether or not
// the spike guard reads it, so that every run's collectives carry the same payloads
// (docs/DESIGN.md, "No host synchronisation in the step").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "ddp/reducer.h"
#include "models/deferred_init.h"
#include "models/model.h"
#include "train/muon.h"
#include "train/optimizer.h"
#include "train/options.h"
#include "train/placement.h"
#include "train/unit_gate.h"

namespace train {

class ModelState {
 public:
  // `forwards`: the model's forwards in one pass (a micro-batch's forward and backward): 2 when
  // the objective runs the model again as its reference (train/objective.h), which the unit
  // gate's order then lists twice.
  ModelState(const TrainerOptions& options, const Placement& placement, models::Model& model,
             int forwards = 1);

  // ddp.shard: none: AdamW over the model's parameters (sharded modes make theirs with the
  // Reducer). Local.
  void allocate_optimizer();
  // The Reducer's buckets under the configured mode (its parameter check is collective, then it
  // only allocates), the sharded AdamW and the clipper.
  void allocate_gradients() { allocate_gradients(configured_shard()); }
  // ddp.shard: parameters, after the broadcast: each rank keeps its blocks, and the model gets
  // the unit gate. Local.
  void shard_parameters_after_broadcast();
  // ddp.shard: parameters with a model built without storage (models/deferred_init.h): each
  // rank fills its master blocks unit by unit (the recorded initialisation replayed into one unit
  // at a time, or model.init_from's ranges read straight into the blocks), and the model gets
  // the unit gate. No broadcast: every rank computes, or reads, the same values. Local.
  void materialise_deferred();
  // Whether the model was built without storage (under ddp.shard: parameters, the only mode
  // that builds so): no parameter to broadcast.
  bool deferred() const;
  // The rung shard_optimizer: a replicated run becomes ddp.shard: optimizer in place, each rank
  // keeping its blocks of the moments (sliced, not reset). Local; every rank takes it together.
  void shard_optimizer_in_place();
  // The rung shard_parameters: a run under none, optimizer or gradients becomes ddp.shard:
  // parameters in place (a new Reducer over the model's units; each rank keeps its blocks of the
  // parameters and moments). Collective (the new Reducer's check, sharded moments gathered).
  void shard_parameters_in_place();

  // ddp.shard as configured.
  ddp::ShardMode configured_shard() const;
  // The mode in force: the Reducer's once it exists, the configured one before.
  ddp::ShardMode shard_mode() const {
    return reducer_ != nullptr ? reducer_->shard_mode() : configured_shard();
  }
  ddp::Reducer& reducer() { return *reducer_; }
  const ddp::Reducer& reducer() const { return *reducer_; }
  FusedAdamW& optimizer() { return *optimizer_; }
  const FusedAdamW& optimizer() const { return *optimizer_; }
  GradClipper& clipper() { return *clipper_; }
  // train.optimizer: muon (null otherwise).
  const Muon* muon() const { return muon_.get(); }
  // The update of one step at the schedule's `factor` of each group's peak learning rate;
  // `found_inf` (float [1] on the device) skips it. AdamW, then Muon (collective: train/muon.h).
  void step(double factor, const at::Tensor& found_inf);
  // Bytes of optimizer state on this rank: AdamW's moments (Muon's momentum among them) and
  // Muon's buffers.
  int64_t optimizer_bytes() const;
  // ddp.shard: parameters (null otherwise).
  UnitGatherer* gate() { return gate_.get(); }
  // Whether the model drives the gate itself (models::ParameterUnits); otherwise it is one unit,
  // gathered for the whole forward and backward.
  bool model_has_units() const;
  // float [1] on the device: this rank's loss is written into it before backward; it holds the
  // sum over ranks once the step's collective that carries it is done.
  const at::Tensor& loss_rider() const;
  // Every unit gathered while the result lives (ddp.shard: parameters; null otherwise); `frozen`
  // false: their frozen tensors (LoRA's base) left sharded. Collective: every rank, at the same
  // point.
  std::unique_ptr<PinnedUnits> pin(bool frozen = true);
  // Forwards some ranks run and others not (evaluation, samples): the units gathered in step
  // (UnitGatherer::begin_lockstep; a model without units pinned). Null unless ddp.shard:
  // parameters. Collective, and its finish() too.
  std::unique_ptr<LockstepUnits> units_in_step();
  // The state a checkpoint writes and resume reads into (views).
  checkpoint::RunState run_state();
  // The dtype units are gathered in (the compute dtype; Undefined: fp32) and the wire dtype of
  // ddp.reduce_dtype (Undefined: the buckets' own).
  c10::ScalarType gather_dtype() const;
  c10::ScalarType reduce_wire_dtype() const;

 private:
  // The Reducer's buckets under `mode` (the configured one, or parameters for the rung).
  void allocate_gradients(ddp::ShardMode mode);
  // ddp.shard: parameters: the model's units as indices into its parameter list (empty: one).
  std::vector<std::vector<size_t>> parameter_units(ddp::ShardMode mode) const;
  // ddp.shard: parameters: each unit's frozen buffers (models::ParameterUnits::frozen_units).
  std::vector<ddp::NamedParameters> frozen_units(ddp::ShardMode mode) const;
  std::unique_ptr<FusedAdamW> make_sharded_optimizer() const;
  // train.optimizer: muon: the ranges of each parameter (unsharded) or block (sharded) AdamW
  // updates (empty: every element, for adamw).
  std::vector<ElementRanges> adamw_updates(bool sharded) const;
  // train.optimizer: muon: Muon over the Reducer's layout and the optimizer's first moments.
  void make_muon();
  void install_gate();
  // materialise_deferred's ways: the recorded initialisations replayed (frozen tensors too), or
  // model.init_from read into this rank's blocks (of the parameters, or of the frozen base).
  void replay_initialisation(const models::DeferredRecord& record);
  void read_master_blocks(const models::ParameterReader& read);
  void read_frozen_blocks(const models::ParameterReader& read);
  void make_clipper();
  // The moments of the old optimizer, sliced into the new blocks, with its step counts.
  void restore_moments(std::vector<at::Tensor> m, std::vector<at::Tensor> v, int64_t steps,
                       const at::Tensor& count);

  const TrainerOptions& options_;
  const Placement& placement_;
  models::Model& model_;
  int forwards_ = 1;  // the model\'s forwards per pass
  std::unique_ptr<ddp::Reducer> reducer_;
  std::unique_ptr<FusedAdamW> optimizer_;
  std::unique_ptr<GradClipper> clipper_;
  std::unique_ptr<UnitGatherer> gate_;
  MuonTargets targets_;  // train.optimizer: muon: its matrices (none: adamw)
  std::unique_ptr<Muon> muon_;
  bool muon_logged_ = false;
};

}  // namespace train
