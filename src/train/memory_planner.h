// MemoryPlanner: this rank's memory plan before step 1 and its checks while training
// (docs/DESIGN.md, "The OOM protocol"): whether the state kept for the whole run fits under the
// configured ddp.shard (and which mode would), persistent allocations agreed by every rank, the
// activation probe, and the micro-batch that fits; then the memory tables and the plan's peak
// against the measured one. The plan is a memory::MemoryEstimate (memory/estimator.h), which the
// banner, --dry-run and the fallback rungs read and update.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddp/buckets.h"
#include "ddp/reducer.h"
#include "ddp/shard.h"
#include "memory/estimator.h"
#include "models/model.h"
#include "train/batches.h"
#include "train/objective.h"
#include "train/options.h"
#include "train/placement.h"
#include "train/unit_gate.h"

namespace train {

// Every rank's out-of-memory description, the empty ones (no failure) left out. Collective.
std::vector<std::string> gather_failures(ddp::Communicator& control, const std::string& mine);

class MemoryPlanner {
 public:
  MemoryPlanner(const TrainerOptions& options, const Placement& placement);

  memory::MemoryEstimate& estimate() { return estimate_; }
  const memory::MemoryEstimate& estimate() const { return estimate_; }

  // The buckets `mode` would make of `model` (sizes only): by bucket caps, or one per unit for
  // parameters (a model without models::ParameterUnits is one unit).
  std::vector<ddp::BucketLayout> planned_layout(models::Model& model, ddp::ShardMode mode) const;
  // What this rank would keep between steps under `mode`.
  ddp::ShardFootprint footprint(models::Model& model, ddp::ShardMode mode) const;

  // Before any allocation: every rank checks that the state it keeps for the whole run fits its
  // memory under `mode`, and if one does not, every rank throws the same ddp::PlanError naming
  // the mode that would fit. Collective.
  void check_state_fits(models::Model& model, ddp::ShardMode mode);
  // Runs `allocate` (this rank's persistent allocations, no collectives), then votes: if any rank
  // ran out of memory, every rank throws the same memory::OutOfMemoryFatal naming `what`.
  // Collective.
  // `vote_errors`: any other error of `allocate` (a file that cannot be read) is voted on too,
  // and every rank throws std::invalid_argument with the failing ranks' messages.
  void allocate_agreed(const std::string& what, const std::function<void()>& allocate,
                       bool vote_errors = false);
  // The parameters, caches and other tensors the model holds on the device, into the estimate
  // (after the model moved there). Local.
  void count_model_state(models::Model& model, const std::function<void()>& build_caches);
  // ddp.shard: parameters: the parameters a rank keeps into the estimate: its master blocks, at
  // most two units gathered in a step, and the buffers. Local.
  void count_parameter_shards(models::Model& model, const ddp::Reducer& reducer);
  // Whether the plan's peak at `micro_batch` with an asynchronous checkpoint's host copy
  // (estimate().checkpoint_copy) fits every rank's memory; when not, the copy leaves the plan
  // (the caller writes checkpoints synchronously, Note [A bounded shard write]) and rank 0 says
  // so. Collective.
  bool checkpoint_copy_fits(int64_t micro_batch);
  // Peak of forward + backward at two micro-batch sizes (halved while they run out of memory),
  // with everything persistent already allocated; backward accumulates into the Reducer's
  // buckets without reducing. Local: no collectives.
  // ddp.shard: parameters with `gate` (a deferred build, sharded before the probe): each pass
  // gathers the units and is collective; every rank probes the same sizes, an out-of-memory
  // failure completes its pass (UnitGatherer::complete_failed_pass) and is voted on after each
  // pass.
  // Each pass computes `objective`'s loss (train/objective.h; null: the model's).
  void probe_activations(models::Model& model, ddp::Reducer& reducer, Batches& batches,
                         UnitGatherer* gate = nullptr, const Objective* objective = nullptr);
  // micro_batch_size auto: the largest micro-batch that fits, the same on every rank (the
  // smallest over ranks). Collective; returns it.
  int64_t choose_micro_batch(int64_t largest);

  // Rank 0 logs the plan's peak at `micro_batch` against the peak measured since the last table.
  // Collective.
  void compare_estimate(int64_t step, int64_t micro_batch);
  // Gathers every rank's memory sample to rank 0, which logs the table; resets the peaks.
  // Collective.
  void report_memory(const std::string& title);

 private:
  // probe_activations' passes, with objective_ set.
  void probe_passes(models::Model& model, ddp::Reducer& reducer, Batches& batches,
                    UnitGatherer* gate);
  // Bytes this rank plans with (memory.cpu_budget_mb or the machine on CPU; the device capped
  // by memory.fraction on a GPU); 0 when unknown.
  int64_t target() const;
  // What `mode` keeps, as check_state_fits counts it: `base` plus the mode's state.
  int64_t need(models::Model& model, ddp::ShardMode mode, int64_t base) const;
  // The message of a rank whose state does not fit under `mode`.
  std::string does_not_fit(models::Model& model, ddp::ShardMode mode, int64_t base,
                           int64_t target) const;
  // One probe at `b1` and `b2` samples into the estimate (the chunked loss's third probe too).
  void probe_at(models::Model& model, const data::Batch& batch, int64_t b1, int64_t b2,
                UnitGatherer* gate);
  // The peak of one forward and backward of the first `samples` of `batch` (a voted pass under
  // `gate`: c10::OutOfMemoryError on every rank when one ran out), less what the pass allocated
  // and kept (a GPU library's workspaces, made on first use: held for the whole run, counted once
  // with the other tensors by probe_activations, not as activations of the first probe's size).
  int64_t peak_of_pass(models::Model& model, const data::Batch& batch, int64_t samples,
                       UnitGatherer* gate);

  const TrainerOptions& options_;
  const Placement& placement_;
  const Objective* objective_ = nullptr;  // the probe's loss (null: the model's)
  memory::MemoryEstimate estimate_;
};

}  // namespace train
