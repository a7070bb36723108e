// Batches: the global batches of a run as one rank reads them: the sampler's order (ddp/
// rank_sampler.h), the loader reading this rank's slice of the coming steps ahead (data/
// loader.h), and the plan that cuts the slice into micro-batches (ddp/batch_plan.h). The
// micro-batch is the same on every rank; a memory fallback changes it (set_micro_batch), never
// the slice, so a step re-run after a fallback reads the same samples. A mixture of sources
// (data.mixture) is drawn by weight (ddp/mixture_order.h): rank 0 logs its sources at start-up
// and, once, the step at which each first wraps around into a new pass.
//
// Test hook: with the environment variable TRAINER_TEST_DATA_ORDER=DIR, every rank appends a
// line "STEP OFFSET INDEX..." per step it reads (its slice of the global batch, as dataset
// indices) to DIR/rank_R.txt, so that a test can compare the sample order of runs.
//
// Each micro-batch's weight is its targets over the global batch's (Dataset::target_count;
// docs/DESIGN.md, "Global batch semantics"). Both counts are host lookups by index: when the
// loader asks for a step's indices (under its lock, in step order, on a worker thread), the
// global batch's count is taken from all G indices of the step, which every rank holds alike,
// and this rank's indices are kept; weight() then counts a micro-batch's from them. No
// collective, no read of the device.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "ddp/batch_plan.h"
#include "ddp/rank_sampler.h"
#include "train/options.h"

namespace train {

class Batches {
 public:
  // Rank `rank` of `world`; the loader starts with start().
  Batches(const data::Dataset& dataset, const TrainOptions& train,
          const data::LoaderOptions& loader, int world, int rank, c10::Device device);
  // Stops the loader's workers first: they call take_indices(), which uses the members below.
  ~Batches();

  const data::Dataset& dataset() const { return dataset_; }
  const ddp::BatchPlan& plan() const { return plan_; }
  int64_t steps_per_epoch() const { return sampler_.steps_per_epoch(); }
  // The job-wide micro-batch (the same on every rank; the plan clamps it to this rank's slice).
  // It starts as the configured one, or a whole slice (the larger slice, so that the number is
  // the same on every rank), capped at the larger slice.
  int64_t micro_batch() const { return micro_batch_; }
  // Sets the job-wide micro-batch and plans with it; `equal_counts`: every rank runs as many
  // micro-batches (ddp.shard: parameters, BatchPlan::equalize_micro_batches).
  void set_micro_batch(int64_t micro_batch, bool equal_counts);
  // Plans with the configured train.micro_batch_size (0: auto, one micro-batch per slice until
  // the micro-batch is chosen), leaving micro_batch() as it is.
  void plan_configured(bool equal_counts);

  // The loader's workers start reading ahead (the micro-batch chosen).
  void start();
  // This rank's slice of batch `index` (from 0), read ahead by the loader.
  data::Batch get(int64_t index);
  // The device copy of `n` samples of `batch` from `offset` (n == 0: the slice's last sample,
  // which a rank with fewer samples than micro-batches runs with weight 0). A packed batch's
  // positions stay on the host (pinned, on a GPU): the model finds the documents there
  // (models/documents.h).
  data::Batch micro_batch(const data::Batch& batch, int64_t offset, int64_t n) const;
  // The loss weight of samples [offset, offset + n) of this rank's slice of batch `index` (got
  // last): their targets over the global batch's, 0 for n == 0 or a global batch without
  // targets. Without masks it is n / G exactly (n T / G T, correctly rounded).
  double weight(int64_t index, int64_t offset, int64_t n) const;
  // Whether the samples are packed documents (Batch::positions defined).
  bool packed() const { return packed_; }
  // This rank's slice of the first batch, read at once (the memory probe).
  data::Batch first_slice();
  // Host bytes the loader and the sampler hold for a step of `step_bytes`.
  int64_t host_bytes(int64_t step_bytes) const;
  double data_wait_s() const { return loader_ != nullptr ? loader_->waited_s() : 0.0; }

 private:
  const data::Dataset& dataset_;
  const TrainOptions& train_;
  data::LoaderOptions loader_options_;
  int world_;
  int rank_;
  c10::Device device_;
  int64_t micro_batch_;
  ddp::BatchPlan plan_;
  ddp::RankSampler sampler_;
  std::unique_ptr<data::Loader> loader_;
  bool packed_ = false;
  // Per step whose indices the loader took and get() has not passed: the global batch's targets
  // and this rank's indices (a copy). The loader's thread writes, the training thread reads.
  struct StepTargets {
    int64_t global = 0;
    at::Tensor indices;
  };
  mutable std::mutex targets_mutex_;
  std::map<int64_t, StepTargets> targets_;

  void replan(int64_t micro_batch, bool equal_counts);
  // The loader's indices of batch `index` (called under its lock, on a worker): this rank's
  // slice [offset, offset + size), with the targets recorded.
  at::Tensor take_indices(int64_t index, int64_t offset, int64_t size);
  std::vector<int64_t> wrap_steps_;  // a mixture: per source, the step (from 0) of its first wrap
  std::vector<bool> wrap_logged_;    // ... and whether rank 0 logged it
  std::string order_dir_;            // TRAINER_TEST_DATA_ORDER
  std::unique_ptr<ddp::RankSampler> order_sampler_;  // its own: the loader's runs on workers

  // A mixture: rank 0's line of its sources (at start-up).
  void describe_mixture() const;
  // A mixture: rank 0 logs the sources that first wrap around in step `index` (once each).
  void log_wraps(int64_t index);
  void record_order(int64_t index);
};

}  // namespace train
