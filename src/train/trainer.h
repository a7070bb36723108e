// Trainer: the data-parallel training step of one rank, and the state it needs. The loop around
// it (step lines, evaluation, checkpoints: periodic actions) is TrainingLoop (train/loop.h), which
// run() hands the work to; set-up is in trainer_setup.cpp, the memory plan and the OOM protocol in
// trainer_memory.cpp.
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
// the same global batch again. Past the last rung, every rank throws memory::OutOfMemoryFatal; so
// does every rank when some rank cannot allocate its persistent state at construction. The
// optimizer step allocates nothing; if it runs out anyway, that rank throws
// memory::OutOfMemoryAbort.
//
// Sharded (ddp.shard, ddp/reducer.h): the Reducer reduce-scatters the gradients, the optimizer
// updates this rank's blocks, and the Reducer all-gathers the parameters after the update; the
// clip norm and fp16's verdict are combined across ranks on the device after the status vote, so
// every rank posts them. Checkpoints gather the moments into the unsharded file format
// (checkpoint.format: single) or are written by every rank (sharded; train/checkpoint_sharded.h).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "ddp/batch_plan.h"
#include "ddp/communicator.h"
#include "ddp/rank_sampler.h"
#include "ddp/reducer.h"
#include "ddp/shard.h"
#include "memory/allocator_guard.h"
#include "memory/estimator.h"
#include "memory/fallback.h"
#include "memory/oom.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/checkpoint_sharded.h"
#include "train/evaluation.h"
#include "train/graph_step.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/options.h"
#include "train/pending_checkpoint.h"
#include "train/periodic.h"
#include "train/precision.h"
#include "train/report/results.h"
#include "train/spike_guard.h"
#include "train/step_metrics.h"
#include "train/step_rng.h"
#include "train/unit_gate.h"

namespace train {

// ddp.shard_group: node (hybrid sharding): the data-plane communicators over this node's ranks
// (the shards span it) and over the ranks of every node with this node rank (the shards are
// replicated over it); from ddp::MpiRuntime::node() / cross_node(). Both or neither.
struct HybridComms {
  ddp::Communicator* node = nullptr;
  ddp::Communicator* cross_node = nullptr;
};

class Trainer {
 public:
  // `hybrid`: required when options.ddp.shard_group is node (std::logic_error otherwise).
  Trainer(const TrainerOptions& options, ddp::Communicator& control, ddp::Communicator& data,
          std::shared_ptr<models::Model> model, const data::Dataset& dataset, c10::Device device,
          HybridComms hybrid = {});

  // Runs the steps after start_step() up to train.steps (TrainingLoop, train/loop.h);
  // `stop_requested` is polled each step and voted on by all ranks.
  RunSummary run(const std::function<bool()>& stop_requested = nullptr);
  // Registers an action run() runs between steps (train/periodic.h), after the built-in ones
  // (memory tables, evaluation) due at the same step and before its checkpoints. A collective
  // action must be registered on every rank with the same cadence.
  void add_periodic(PeriodicAction action) { periodic_.push_back(std::move(action)); }
  // train.sample_every: after every N-th step run() calls `sample` and logs "sample at step S:
  // TEXT" (a periodic action timed as "samples"). Set on rank 0 only (the others do not wait for
  // it: the next step's collectives do). It must leave the training state alone
  // (models/gpt/generate.h: eval mode, its own generator).
  void set_sampler(std::function<std::string()> sample);
  // What evaluation reads besides the dataset (train/evaluation.h: eval.tasks, bits per byte);
  // set on every rank alike before run(): the tasks' all-reduces are collective.
  void set_eval_inputs(EvalInputs inputs) { eval_inputs_ = std::move(inputs); }
  const EvalInputs& eval_inputs() const { return eval_inputs_; }

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

  const TrainerOptions& options() const { return options_; }
  ddp::Communicator& control() { return control_; }
  const data::Dataset& dataset() const { return dataset_; }
  c10::Device device() const { return device_; }
  Precision precision() const { return precision_; }
  const ddp::BatchPlan& plan() const { return plan_; }
  int64_t steps_per_epoch() const { return sampler_.steps_per_epoch(); }
  double data_wait_s() const { return loader_->waited_s(); }          // the loader's wait so far
  int64_t skipped_steps() const { return metrics_.skipped_total(); }  // as of the last read
  const ddp::Reducer& reducer() const { return *reducer_; }
  const FusedAdamW& optimizer() const { return *optimizer_; }  // this rank's moments
  models::Model& model() { return *model_; }
  int fallbacks() const { return fallbacks_; }
  const GraphStep& graphs() const { return *graphs_; }
  // This rank's memory plan (activations from the probe at construction).
  const memory::MemoryEstimate& memory_estimate() const { return estimate_; }
  // What this rank would keep between steps under each ddp.shard mode (the Reducer's buckets).
  ddp::ShardFootprint footprint(ddp::ShardMode mode) const;
  // The buckets `mode` would make (sizes only): by bucket caps, or one per unit for parameters.
  std::vector<ddp::BucketLayout> planned_layout(ddp::ShardMode mode) const;
  // ddp.shard in force (none becomes optimizer after the shard_optimizer rung).
  ddp::ShardMode shard_mode() const { return shard_; }
  // Gathers every rank's memory sample to rank 0, which logs the table; resets the peaks.
  // Collective.
  void report_memory(const std::string& title);
  // Rank 0 logs the plan's peak against the peak measured since the last table. Collective.
  void compare_estimate(int64_t step);

  // ddp.shard: parameters: every unit gathered while the result lives (evaluation, checkpoints,
  // tests reading the parameters); null otherwise. Collective: every rank, at the same point.
  std::unique_ptr<PinnedUnits> pin_parameters();

  // Writes a checkpoint with `steps_done` optimizer steps to `path` (".../NAME.safetensors").
  // checkpoint.format single: rank 0 writes that file (train/checkpoint.h); sharded: every rank
  // writes its shard into the directory ".../NAME" (train/checkpoint_sharded.h,
  // checkpoint_writer.cpp). First finishes the previous checkpoint (finish_checkpoint). The state
  // is copied to host memory before it returns; under checkpoint.async the files are written in
  // the background and the checkpoint is complete only after finish_checkpoint, otherwise at
  // once. Collective. Returns what is written (the file or the directory).
  std::string save_checkpoint(const std::string& path, int64_t steps_done);
  // Waits for the checkpoint being written (if any), then every rank votes on its file and rank 0
  // commits it (the manifest, the rename), removes what interrupted writes left and applies
  // checkpoint.keep_last. A failed write on any rank is the same CheckpointError on every rank.
  // Collective; a no-op on every rank when nothing is pending.
  void finish_checkpoint();
  // Whether checkpoints are written sharded (checkpoint.format: sharded, or auto with ddp.shard
  // configured not none).
  bool sharded_checkpoints() const;

  // Continues from a checkpoint that rank 0 read (and whose parameters it applied to the model
  // before construction); run() starts after the checkpoint's last step. Other ranks pass
  // nullptr; so does rank 0 when there is nothing to resume. A checkpoint read whole: AdamW's
  // moments are broadcast from rank 0 (sharded modes: each rank keeps its blocks). A sharded one
  // opened (ShardedRead::kOpen): its path goes to every rank, and each rank reads only the
  // moments it keeps from the files (sharded modes: its blocks; unsharded: the whole moments);
  // a rank that cannot read its part fails every rank, naming the file (voted). Collective.
  void resume(const Checkpoint* ckpt);
  // Tensor bytes this rank read from a sharded checkpoint's files in resume() (a test hook).
  int64_t resume_bytes_read() const { return resume_bytes_read_; }
  // Optimizer steps already done (resumed from a checkpoint): the next step is start_step() + 1.
  int64_t start_step() const { return start_step_; }

 private:
  // The two formats' host copy and background write (checkpoint_writer.cpp).
  std::unique_ptr<PendingCheckpoint> start_sharded_checkpoint(const std::string& step_dir,
                                                              int64_t steps_done);
  std::unique_ptr<PendingCheckpoint> start_single_checkpoint(const std::string& path,
                                                             int64_t steps_done);
  // resume() from an opened sharded checkpoint (`manifest`: rank 0's, verified; nullptr: read
  // it). Voted.
  void read_own_moments(const std::string& step_dir, const io::ShardManifest* manifest);
  // Sharded modes: this rank's block of every bucket of both moments, from the files.
  void read_moment_blocks(ShardedReader& reader);

  // Set-up, in the order the constructor runs it (trainer_setup.cpp).
  // The micro-batch every rank starts from: the configured one, or a whole per-rank slice (the
  // larger slice, so the number is the same on every rank).
  static int64_t initial_micro_batch(const TrainOptions& t, int world);
  // Parameters, caches, the unsharded optimizer, the metric slots and the loss scaler. Local.
  void allocate_model_state();
  // The Reducer's buckets (its parameter check is collective), the sharded optimizer, the
  // clipper.
  void allocate_gradients();
  // channels-last weights where train.channels_last asks for them (before the Reducer).
  void apply_channels_last();
  // ddp.shard: parameters: the model's units as indices into its parameter list (empty: one).
  std::vector<std::vector<size_t>> parameter_units();
  // ddp.shard: parameters, after the broadcast: each rank keeps its blocks, the gate is set.
  void shard_parameters_after_broadcast();
  // The ladder of memory.fallback, with each rung's effect on this Trainer.
  memory::FallbackLadder make_ladder();
  void make_loader();
  void broadcast_model();
  // ddp.reduce_dtype as the Reducer takes it: bf16, or Undefined for the buckets' own dtype.
  c10::ScalarType reduce_wire_dtype() const;
  // ddp.shard: parameters: the dtype units are gathered in (the compute dtype; Undefined: fp32).
  c10::ScalarType gather_dtype() const;
  // The AdamW of a sharded run: over this rank's blocks of the Reducer's buckets.
  std::unique_ptr<FusedAdamW> make_sharded_optimizer() const;

  // The step (trainer.cpp).
  struct Attempt {
    std::string failure;  // this rank's out-of-memory description; empty when none
  };
  // Forward and backward of every micro-batch, the reduction and fp16's unscale; an OOM becomes
  // the attempt's failure.
  Attempt forward_backward(int64_t step);
  // The device copy of `n` samples of `batch` from `offset` (n == 0: see micro_batch_data()).
  data::Batch micro_batch_data(const data::Batch& batch, int64_t offset, int64_t n) const;
  // The batch plan for `micro_batch` (equal micro-batch counts under ddp.shard: parameters).
  ddp::BatchPlan make_plan(int64_t micro_batch) const;
  // One micro-batch's forward and backward (`graphed`: replayed through the CUDA graph).
  void micro_batch_forward_backward(int64_t step, const data::Batch& micro, double weight,
                                    bool graphed, bool inject, memory::Phase& phase);
  // Clip, AdamW, gather: after the vote, never retried.
  void update(int64_t step, StepResult& r);
  // train.inject_nonfinite names this rank at `step`.
  bool injects_nonfinite(int64_t step) const;
  bool injects_spike(int64_t step) const;  // train.inject_spike names `step`
  // The gradient clipper over the Reducer's reduced gradients (`sharded`: summing the squared
  // norms over the ranks), and the spike guard's global loss where it rides (loss_rider_).
  void make_clipper(bool sharded);

  // The memory plan and the out-of-memory protocol (trainer_memory.cpp):
  // Every rank's out-of-memory description, the empty ones (no failure) left out. Collective.
  std::vector<std::string> gather_failures(const std::string& mine);
  // After a failed vote: the next rung on every rank, or OutOfMemoryFatal.
  void fall_back(int64_t step, const std::string& my_failure);
  // Past the last rung: rank 0 writes the oom checkpoint; the error every rank throws.
  memory::OutOfMemoryFatal fallbacks_spent(int64_t step, const std::vector<std::string>& failures);
  // The rungs' effects; each returns what changed, for the "taken" line.
  std::string halve_micro_batch(int64_t old_micro_batch, int64_t new_micro_batch);
  std::string shard_optimizer();
  // The rung shard_optimizer: the replicated run becomes ddp.shard: optimizer in place, each rank
  // keeping its blocks of the moments (sliced, not reset). Local; every rank takes it together.
  void shard_optimizer_in_place();
  // The rung shard_parameters: a run under none, optimizer or gradients becomes ddp.shard:
  // parameters in place (a new Reducer over the model's units; each rank keeps its blocks of the
  // parameters and moments). Collective (the new Reducer's check, sharded moments gathered);
  // every rank takes it together, after the vote.
  std::string shard_parameters();
  void shard_parameters_in_place();
  // Before any allocation: every rank checks that the state it keeps for the whole run fits its
  // memory under the configured ddp.shard, and if one does not, every rank throws the same
  // ddp::PlanError naming the mode that would fit. Collective.
  void check_state_fits();
  // Runs `allocate` (this rank's persistent allocations, no collectives), then votes: if any
  // rank ran out of memory, every rank throws the same memory::OutOfMemoryFatal. Collective.
  void allocate_agreed(const std::string& what, const std::function<void()>& allocate);
  // Peak of forward + backward at two micro-batch sizes (halved while they run out of memory),
  // once everything persistent is allocated. Local: no collectives.
  void probe_activations();
  // micro_batch_size auto: the largest micro-batch that fits, the same on every rank. Collective.
  void choose_micro_batch();

  // Configuration and borrowed collaborators.
  TrainerOptions options_;
  ddp::Communicator& control_;
  ddp::Communicator& data_;
  // The ranks a shard spans (ddp.shard_group: data_, or the node's) and, hybrid, the ones its
  // shards are replicated over (nullptr: none).
  ddp::Communicator& shard_comm_;
  ddp::Communicator* replicas_;
  std::shared_ptr<models::Model> model_;
  const data::Dataset& dataset_;
  c10::Device device_;
  Precision precision_;
  // What one step runs over; a fallback changes the first three.
  ddp::ShardMode shard_;  // ddp.shard in force
  int64_t micro_batch_;   // job-wide micro-batch (the same on every rank)
  ddp::BatchPlan plan_;
  ddp::RankSampler sampler_;
  std::unique_ptr<data::Loader> loader_;  // reads the coming steps' batches ahead
  std::unique_ptr<ddp::Reducer> reducer_;
  std::unique_ptr<FusedAdamW> optimizer_;
  std::unique_ptr<GradClipper> clipper_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 loss scaling (disabled otherwise)
  std::unique_ptr<GraphStep> graphs_;   // train.cuda_graphs
  std::unique_ptr<UnitGate> gate_;      // ddp.shard: parameters
  bool model_has_units_ = false;        // the model drives the gate (models::ParameterUnits)
  StepMetrics metrics_;                 // the loss on the device; the logged steps' one read
  std::vector<std::pair<int, int64_t>> nonfinite_injections_;  // (rank, step) test hook
  std::unique_ptr<SpikeGuard> guard_;                          // train.skip_spikes (null: off)
  // The guard's global loss (float [1] on the device): this rank's loss is written into it before
  // backward, and it holds the sum over ranks once the step's collective that carries it is done
  // (the Reducer's first bucket, or the clipper's norm; train/spike_guard.h).
  at::Tensor loss_rider_;
  std::vector<int64_t> spike_injections_;  // train.inject_spike test hook
  // The OOM protocol.
  memory::MemoryEstimate estimate_;
  memory::FallbackLadder ladder_;
  int fallbacks_ = 0;
  int64_t start_step_ = 0;  // optimizer steps already done (resumed from a checkpoint)
  int64_t resume_bytes_read_ = 0;
  std::vector<PeriodicAction> periodic_;  // add_periodic: run() runs them
  // Written, not yet committed. Destroyed (the Trainer too): waits for the write, which is then
  // not committed (no collective there), so it is not a checkpoint.
  std::unique_ptr<PendingCheckpoint> pending_checkpoint_;
  EvalInputs eval_inputs_;
};

}  // namespace train
