#include "data/mixture.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "core/blend.h"
#include "data/errors.h"
#include "data/readers.h"
#include "data/token_shards.h"

namespace data {
namespace {

std::vector<double> normalised(std::vector<double> weights) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  for (double& w : weights) w /= sum;
  return weights;
}

// A blend of finite sources by weight: the validation splits.
class BlendedSplits final : public Dataset {
 public:
  BlendedSplits(std::vector<std::shared_ptr<const Dataset>> splits,
                const std::vector<double>& weights)
      : splits_(std::move(splits)) {
    std::vector<int64_t> sizes;
    for (const auto& s : splits_) sizes.push_back(s->size());
    order_ = blend_once(normalised(weights), sizes);
  }
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }
  core::Shape shape() const override { return splits_.front()->shape(); }
  Batch get(const at::Tensor& indices) const override {
    return gather_samples(splits_, picks(indices));
  }
  int64_t target_count(const at::Tensor& indices) const override {
    int64_t n = 0;
    for (const auto& [k, i] : picks(indices)) {
      n += splits_[k]->target_count(at::tensor({i}, at::kLong));
    }
    return n;
  }

 private:
  std::vector<std::pair<size_t, int64_t>> picks(const at::Tensor& indices) const {
    std::vector<std::pair<size_t, int64_t>> out;
    const at::Tensor idx = indices.to(at::kLong).contiguous();
    const int64_t* p = idx.data_ptr<int64_t>();
    for (int64_t j = 0; j < idx.numel(); ++j) out.push_back(order_.at(p[j]));
    return out;
  }
  std::vector<std::shared_ptr<const Dataset>> splits_;
  std::vector<std::pair<size_t, int64_t>> order_;
};

}  // namespace

std::vector<std::pair<size_t, int64_t>> blend_once(const std::vector<double>& weights,
                                                   const std::vector<int64_t>& sizes) {
  std::vector<std::pair<size_t, int64_t>> order;
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> counts(weights.size(), 0);
  std::vector<bool> open(weights.size());
  for (size_t k = 0; k < sizes.size(); ++k) open[k] = sizes[k] > 0;
  for (int64_t i = 0; i < total; ++i) {
    const size_t k = core::most_behind(weights, counts, i, open);
    order.emplace_back(k, counts[k]++);
    if (counts[k] == sizes[k]) open[k] = false;
  }
  return order;
}

namespace {

// Source k's training windows, and its validation split (if any), opened as data.path would be.
std::shared_ptr<TokenShardDataset> open_source(const DataOptions& o, size_t k) {
  const MixtureSource& s = o.mixture[k];
  try {
    const ShardFiles files = find_shards(s.path, "");
    return std::make_shared<TokenShardDataset>(files.train, o.context, o.vocab_size,
                                               files.validation, o.packing);
  } catch (const DataError& e) {
    std::string why = e.what();
    if (why.starts_with("data.path: ")) why = why.substr(11);
    throw DataError(fmt::format("data.mixture[{}] ('{}'): {}", k, s.name, why));
  }
}

}  // namespace

MixtureDataset::MixtureDataset(const DataOptions& o) {
  if (o.mixture.empty()) throw DataError("data.mixture: no sources");
  double sum = 0;
  for (const auto& s : o.mixture) sum += s.weight;
  int64_t width = 0;
  for (size_t k = 0; k < o.mixture.size(); ++k) {
    const std::shared_ptr<TokenShardDataset> source = open_source(o, k);
    if (width != 0 && source->token_width() != width) {
      throw DataError(fmt::format(
          "data.mixture[{}] ('{}'): its shards hold {}-bit token ids, data.mixture[0] ('{}')'s "
          "{}-bit ones: they were written by tokenizers of different vocabularies, and every "
          "source needs the same",
          k, o.mixture[k].name, 8 * source->token_width(), o.mixture[0].name, 8 * width));
    }
    width = source->token_width();
    sources_.push_back({o.mixture[k].name, o.mixture[k].weight / sum, total_, source->size(),
                        source->validation()});
    total_ += source->size();
    data_.push_back(source);
  }
  std::vector<std::shared_ptr<const Dataset>> splits;
  std::vector<double> weights;
  for (const auto& s : sources_) {
    if (s.validation == nullptr) continue;  // blended: the sources that have one
    splits.push_back(s.validation);
    weights.push_back(s.weight);
  }
  if (!splits.empty()) {
    validation_ = std::make_shared<BlendedSplits>(std::move(splits), weights);
  }
}

core::Shape MixtureDataset::shape() const { return data_.front()->shape(); }

namespace {

// Each index's (source, window): source k holds [first, first + size).
std::vector<std::pair<size_t, int64_t>> source_picks(const std::vector<SourceInfo>& sources,
                                                     const at::Tensor& indices) {
  std::vector<std::pair<size_t, int64_t>> out;
  const at::Tensor idx = indices.to(at::kLong).contiguous();
  const int64_t* data = idx.data_ptr<int64_t>();
  out.reserve(idx.numel());
  for (int64_t j = 0; j < idx.numel(); ++j) {
    size_t k = 0;
    while (k + 1 < sources.size() && data[j] >= sources[k + 1].first) ++k;
    if (data[j] < 0 || data[j] >= sources[k].first + sources[k].size) {
      throw std::out_of_range(fmt::format("mixture: index {}", data[j]));
    }
    out.emplace_back(k, data[j] - sources[k].first);
  }
  return out;
}

}  // namespace

Batch MixtureDataset::get(const at::Tensor& indices) const {
  return gather_samples(data_, source_picks(sources_, indices));
}

int64_t MixtureDataset::target_count(const at::Tensor& indices) const {
  std::vector<std::vector<int64_t>> per_source(data_.size());
  for (const auto& [k, w] : source_picks(sources_, indices)) per_source[k].push_back(w);
  int64_t n = 0;
  for (size_t k = 0; k < data_.size(); ++k) {
    if (!per_source[k].empty()) n += data_[k]->target_count(at::tensor(per_source[k]));
  }
  return n;
}

std::optional<PackingStats> MixtureDataset::packing() const {
  std::optional<PackingStats> sum;
  for (const auto& s : data_) {
    const auto stats = s->packing();
    if (!stats) continue;
    if (!sum) {
      sum = stats;
      continue;
    }
    sum->windows += stats->windows;
    sum->documents += stats->documents;
    sum->split_documents += stats->split_documents;
    sum->pieces += stats->pieces;
    sum->tokens += stats->tokens;
    sum->targets += stats->targets;
  }
  return sum;
}

Batch gather_samples(const std::vector<std::shared_ptr<const Dataset>>& sources,
                     const std::vector<std::pair<size_t, int64_t>>& picks) {
  std::vector<std::vector<int64_t>> index(sources.size()), row(sources.size());
  for (size_t j = 0; j < picks.size(); ++j) {
    index[picks[j].first].push_back(picks[j].second);
    row[picks[j].first].push_back(static_cast<int64_t>(j));
  }
  std::vector<std::pair<Batch, at::Tensor>> parts;  // each source's samples and their rows
  bool positions = false;
  for (size_t k = 0; k < sources.size(); ++k) {
    if (index[k].empty()) continue;
    parts.emplace_back(sources[k]->get(at::tensor(index[k], at::kLong)), at::tensor(row[k]));
    positions = positions || parts.back().first.positions.defined();
  }
  const auto n = static_cast<int64_t>(picks.size());
  const Batch& first = parts.front().first;
  auto sized = [n](const at::Tensor& like) {
    std::vector<int64_t> shape = like.sizes().vec();
    shape[0] = n;
    return at::empty(shape, like.options());
  };
  Batch out{sized(first.inputs), sized(first.targets)};
  if (positions) out.positions = at::empty(out.inputs.sizes(), at::kLong);
  for (auto& [b, rows] : parts) {
    out.inputs.index_copy_(0, rows, b.inputs);
    out.targets.index_copy_(0, rows, b.targets);
    if (!positions) continue;
    // A window without document boundaries is one document: positions 0 .. context - 1.
    const at::Tensor p = b.positions.defined()
                             ? b.positions
                             : at::arange(b.inputs.size(1), at::kLong).expand(b.inputs.sizes());
    out.positions.index_copy_(0, rows, p.contiguous());
  }
  return out;
}

std::unique_ptr<Dataset> make_mixture_dataset(const DataOptions& options) {
  if (!options.preference.empty()) {
    throw DataError(fmt::format("data.mixture: train.objective: {} reads the preference pairs of "
                                "one source, data.path; a mixture of them is not supported",
                                options.preference));
  }
  return std::make_unique<MixtureDataset>(options);
}

}  // namespace data
