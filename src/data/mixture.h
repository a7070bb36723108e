// MixtureDataset: several token sources (data.mixture: each a folder of shards, as data.path
// names one, with its validation shards beside them), each with a weight and a name, as one
// dataset: source k's windows are indices [first_k, first_k + N_k), in data.mixture's order.
// The sampler draws them by weight (sources(); ddp/rank_sampler.h and ddp/mixture_order.h: the
// training order, a function of the seed, the weights and the step), so this class only reads.
//
// Validation: validation() blends the sources' validation splits by the same weights, each split
// once (core/blend.h; a source whose split runs out leaves the rest to the others), so the first
// train.eval_samples follow the weights; sources() gives each split apart (train/evaluation.h
// evaluates both).
//
// Sources must agree on the vocabulary: the same token width (uint16 or uint32 ids, which
// different tokenizers write) and ids below data.vocab_size (checked per file at open); each is
// read with data.context and data.packing. Errors are DataErrors naming data.mixture[i] and the
// source's name. Immutable after construction; get() may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace data {

class MixtureDataset final : public Dataset {
 public:
  // Opens every source of options.mixture. Throws DataError naming data.mixture and the source.
  explicit MixtureDataset(const DataOptions& options);

  int64_t size() const override { return total_; }
  core::Shape shape() const override;
  Batch get(const at::Tensor& indices) const override;
  int64_t target_count(const at::Tensor& indices) const override;
  std::optional<PackingStats> packing() const override;
  std::shared_ptr<const Dataset> validation() const override { return validation_; }
  std::vector<SourceInfo> sources() const override { return sources_; }

 private:
  std::vector<SourceInfo> sources_;
  std::vector<std::shared_ptr<const Dataset>> data_;  // each source's training windows
  std::shared_ptr<const Dataset> validation_;
  int64_t total_ = 0;
};

// The sources' weights, blended without repetition: `order[i]` is the (source, index) of
// position i, each source's indices 0 .. sizes[k] - 1 in order, the source furthest below its
// share first (core/blend.h; a source with none left drops out).
std::vector<std::pair<size_t, int64_t>> blend_once(const std::vector<double>& weights,
                                                   const std::vector<int64_t>& sizes);

// The samples `picks` (source, index) of `sources`, in that order, as one batch (positions filled
// for the sources that have none when another has them: 0 .. context - 1, one document).
Batch gather_samples(const std::vector<std::shared_ptr<const Dataset>>& sources,
                     const std::vector<std::pair<size_t, int64_t>>& picks);

}  // namespace data
