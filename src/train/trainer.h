// Trainer: the data-parallel training step of one rank (forward, backward, reduce, update), and
// the state it needs. The loop around it (step lines, evaluation, checkpoints: periodic actions)
// is TrainingLoop (train/loop.h), which the launcher builds over a Trainer; checkpoints are
// written and read by checkpoint::Checkpointer from the state the Trainer hands it
// (run_state()). The step is trainer.cpp, its set-up trainer_setup.cpp; the model's state under
// the shard mode in force is ModelState, the memory plan MemoryPlanner, the OOM fallbacks
// Fallbacks, the batches Batches.
//
// Contract: every rank constructs a Trainer with the same options, a model of the same
// architecture and the same dataset; construction checks that the parameter lists match,
// allocates every persistent buffer (gradient buckets, optimizer state) and broadcasts parameters
// and buffers from rank 0. Every step issues the same collectives in the same order on every rank
// (gradient buckets on the data communicator, then the status vote on the control communicator),
// whatever happens locally, so ranks never wait on an operation another rank skips. `control` is
// MPI (CPU tensors); `data` carries gradients (NCCL for CUDA, MPI for CPU; it may be the same
// object as `control`). The Trainer owns the optimizer and the Reducer; the model and
// communicators are borrowed.
//
// Out of memory (docs/DESIGN.md, "The OOM protocol"): a rank that runs out during forward or
// backward drops the step's tensors, posts its remaining buckets and votes "failed"; if any rank
// failed, all ranks zero their gradients, take the next rung of memory.fallback together and run
// the same global batch again. Past the last rung, every rank throws FallbacksSpent (a
// memory::OutOfMemoryFatal); so does every rank when some rank cannot allocate its persistent
// state at construction. The optimizer step allocates nothing; if it runs out anyway, that rank
// throws memory::OutOfMemoryAbort.
//
// Sharded (ddp.shard, ddp/reducer.h): the Reducer reduce-scatters the gradients, the optimizer
// updates this rank's blocks, and the Reducer all-gathers the parameters after the update; the
// clip norm and fp16's verdict are combined across ranks on the device after the status vote, so
// every rank posts them.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "data/dataset.h"
#include "ddp/batch_plan.h"
#include "ddp/communicator.h"
#include "memory/allocator_guard.h"
#include "memory/estimator.h"
#include "memory/oom.h"
#include "models/model.h"
#include "train/batches.h"
#include "train/fallbacks.h"
#include "train/graph_step.h"
#include "train/loss_scaler.h"
#include "train/memory_planner.h"
#include "train/model_state.h"
#include "train/objective.h"
#include "train/options.h"
#include "train/placement.h"
#include "train/precision.h"
#include "train/report/results.h"
#include "train/schedule.h"
#include "train/spike_guard.h"
#include "train/step_metrics.h"

namespace train {

class Trainer {
 public:
  // `hybrid`: required when options.ddp.shard_group is node (std::logic_error otherwise).
  Trainer(const TrainerOptions& options, ddp::Communicator& control, ddp::Communicator& data,
          std::shared_ptr<models::Model> model, const data::Dataset& dataset, c10::Device device,
          HybridComms hybrid = {});

  // One optimizer step over global batch number `step` (from 1, as the log numbers it), retried
  // with fallbacks after an OOM. It reads nothing from the device unless `read_metrics` (then it
  // calls read_metrics() before returning). Collective.
  StepResult step(int64_t step, bool stop_requested = false, bool read_metrics = true);
  // Copies the last step's loss, gradient norm and fp16 state to the host (one device-to-host
  // read) and averages the loss over ranks (one small all-reduce on the control plane); logs
  // steps skipped since the last read and throws NonFiniteFatal past train.max_skipped_steps in
  // a row (train/step_metrics.h). Call right after step(), on the same steps on every rank.
  // Collective.
  void read_metrics(StepResult& r);
  // Device-to-host reads made by the training step so far (the step's own test hook).
  int64_t host_reads() const { return metrics_.host_reads(); }

  // The state a checkpoint writes, and resume reads into (views). Under ddp.shard: parameters the
  // Checkpointer gathers the units it needs through it.
  checkpoint::RunState run_state();
  // After resume: `steps` optimizer steps are done (AdamW's bias correction continues from
  // there).
  void set_steps_done(int64_t steps);
  // Optimizer steps done (those resumed from a checkpoint and those taken since).
  int64_t steps_done() const { return state_.optimizer().steps(); }

  const TrainerOptions& options() const { return options_; }
  ddp::Communicator& control() { return placement_.control; }
  const Placement& placement() const { return placement_; }
  const data::Dataset& dataset() const { return batches_.dataset(); }
  c10::Device device() const { return placement_.device; }
  Precision precision() const { return options_.train.precision; }
  const ddp::BatchPlan& plan() const { return batches_.plan(); }
  int64_t steps_per_epoch() const { return batches_.steps_per_epoch(); }
  double data_wait_s() const { return batches_.data_wait_s(); }       // the loader's wait so far
  int64_t skipped_steps() const { return metrics_.skipped_total(); }  // as of the last read
  const ddp::Reducer& reducer() const { return state_.reducer(); }
  const FusedAdamW& optimizer() const { return state_.optimizer(); }  // this rank's moments
  models::Model& model() { return *model_; }
  // train.objective over this model (the step's loss, the probe's and evaluation's).
  const Objective& objective() const { return objective_; }
  Objective& objective() { return objective_; }
  int fallbacks() const { return fallbacks_->taken(); }
  // ddp.shard in force (the Reducer's: none becomes optimizer after the shard_optimizer rung).
  ddp::ShardMode shard_mode() const { return state_.shard_mode(); }
  // ddp.shard as configured (checkpoint.format: auto follows it, not a rung's switch).
  ddp::ShardMode configured_shard() const { return state_.configured_shard(); }
  // This rank's memory plan and checks (activations from the probe at construction).
  MemoryPlanner& memory() { return memory_; }
  const memory::MemoryEstimate& memory_estimate() const { return memory_.estimate(); }
  // What this rank would keep between steps under each ddp.shard mode (the Reducer's buckets).
  ddp::ShardFootprint footprint(ddp::ShardMode mode) const {
    return memory_.footprint(*model_, mode);
  }
  // The buckets `mode` would make (sizes only): by bucket caps, or one per unit for parameters.
  std::vector<ddp::BucketLayout> planned_layout(ddp::ShardMode mode) const {
    return memory_.planned_layout(*model_, mode);
  }

  // ddp.shard: parameters: forwards that ranks run in different numbers (evaluation's slices,
  // rank 0's text sample) gather the units in step, one at a time (UnitGatherer, Note [Units in
  // step]); call finish() on every rank at the same point. Null otherwise. Collective.
  std::unique_ptr<LockstepUnits> units_in_step() { return state_.units_in_step(); }

 private:
  // The tests' seam (tests/common/trainer_seam.h): what they read of a Trainer that the code has
  // no use for, such as every unit of a parameter-sharded model gathered (ModelState::pin).
  friend struct TrainerTestSeam;

  // Set-up, in the order the constructor runs it (trainer_setup.cpp).
  // Parameters, caches, the unsharded optimizer, the metric slots, the loss scaler and the spike
  // guard. Local.
  void allocate_model_state();
  // train.objective: dpo without adapters: the reference tables (zeros until
  // prepare_reference fills them, train/reference_logps.h), persistent state before the probe.
  void allocate_reference();
  // The Reducer's buckets (its parameter check is collective), the sharded optimizer, the
  // clipper.
  void allocate_gradients();
  // channels-last weights where train.channels_last asks for them (before the Reducer).
  void apply_channels_last();
  void broadcast_model();
  // After the broadcast: ddp.shard: parameters keeps this rank's blocks; the micro-batch is
  // chosen (auto), the fallbacks are ready and the loader starts.
  void finish_setup();

  // The step (trainer.cpp).
  struct Attempt {
    std::string failure;  // this rank's out-of-memory description; empty when none
  };
  // Forward and backward of every micro-batch, the reduction and fp16's unscale; an OOM becomes
  // the attempt's failure.
  Attempt forward_backward(int64_t step);
  // ddp.shard: parameters, after this rank ran out of memory: the pass under way completed and
  // the micro-batches left run dry, issuing the collectives the other ranks issue (UnitGatherer).
  // Out of memory again is memory::OutOfMemoryAbort (`failure`: the first one). Collective.
  void finish_passes_after_failure(const std::string& failure);
  // Every micro-batch of this rank's slice, forward and backward (`graphed`: replayed through
  // the CUDA graph).
  void run_micro_batches(int64_t step, bool graphed, memory::Phase& phase);
  // Why the step cannot be captured as a CUDA graph ("": it can).
  std::string why_not_graphed(int64_t step) const;
  // One micro-batch's forward and backward.
  void micro_batch_forward_backward(int64_t step, const data::Batch& micro, double weight,
                                    bool graphed, bool inject, memory::Phase& phase);
  // Clip, AdamW, gather: after the vote, never retried.
  void update(int64_t step, StepResult& r);
  // Clip, the non-finite and spike verdicts, fp16's scale, the optimizer at the schedule's
  // `factor` of each group's peak learning rate.
  void clip_and_step(int64_t step, double factor);

  // Test hooks: train.inject_nonfinite's (rank, step) pairs and train.inject_spike's steps.
  struct Injections {
    std::vector<std::pair<int, int64_t>> nonfinite;
    std::vector<int64_t> spikes;
    bool nonfinite_at(int rank, int64_t step) const;
    bool spike_at(int64_t step) const;
  };

  TrainerOptions options_;
  Placement placement_;
  std::shared_ptr<models::Model> model_;
  Objective objective_;   // what a micro-batch's loss is (train.objective)
  Batches batches_;       // what each step runs over; a fallback changes the micro-batch
  MemoryPlanner memory_;  // the plan before step 1, the tables after
  ModelState state_;      // buckets, AdamW, clipper, unit gate: the shard mode in force
  std::unique_ptr<LossScaler> scaler_;  // fp16 loss scaling (disabled otherwise)
  std::unique_ptr<SpikeGuard> guard_;   // train.skip_spikes (null: off)
  std::unique_ptr<GraphStep> graphs_;   // train.cuda_graphs
  StepMetrics metrics_;                 // the loss on the device; the logged steps' read
  Schedule schedule_;                   // train.schedule's plan (resume may re-plan it)
  Injections injections_;
  // This attempt's micro-batches: begun (the Reducer told) and passed through the unit gate.
  struct Passes {
    size_t begun = 0;
    size_t done = 0;
  } passes_;
  std::unique_ptr<Fallbacks> fallbacks_;  // memory.fallback's ladder
};

}  // namespace train
