#include "train/batches.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace train {
namespace {

// The sampler of `dataset`: by weight over a mixture's sources (ddp/mixture_order.h), else epoch
// permutations.
ddp::RankSampler make_sampler(const data::Dataset& dataset, const TrainOptions& train) {
  const auto sources = dataset.sources();
  if (sources.empty()) return {dataset.size(), train.global_batch_size, train.seed};
  std::vector<ddp::MixtureSlice> slices;
  for (const auto& s : sources) slices.push_back({s.first, s.size, s.weight});
  return {slices, train.global_batch_size, train.seed};
}

}  // namespace

Batches::Batches(const data::Dataset& dataset, const TrainOptions& train,
                 const data::LoaderOptions& loader, int world, int rank, c10::Device device)
    : dataset_(dataset), train_(train), loader_options_(loader), world_(world), rank_(rank),
      device_(device), micro_batch_(0),
      plan_(ddp::BatchPlan::make(train.global_batch_size, world, rank, train.micro_batch_size)),
      sampler_(make_sampler(dataset, train)) {
  loader_options_.pin_memory = device.is_cuda();
  const auto stats = dataset.packing();
  packed_ = stats && stats->packing == data::Packing::kDocuments;
  for (size_t k = 0; k < dataset.sources().size(); ++k) {
    wrap_steps_.push_back(sampler_.first_wrap_step(k));
  }
  wrap_logged_.assign(wrap_steps_.size(), false);
  if (const char* dir = std::getenv("TRAINER_TEST_DATA_ORDER")) {
    order_dir_ = dir;
    order_sampler_ = std::make_unique<ddp::RankSampler>(make_sampler(dataset, train));
  }
  if (rank_ == 0 && !wrap_logged_.empty()) describe_mixture();
  const int64_t largest_slice = (train.global_batch_size + world - 1) / world;
  micro_batch_ =
      train.micro_batch_size > 0 ? std::min(train.micro_batch_size, largest_slice) : largest_slice;
}

Batches::~Batches() {
  // Members go in reverse order of declaration, targets_ and its mutex before loader_: the
  // workers, which record each step's targets, are joined before anything they touch is freed.
  loader_.reset();
}

void Batches::replan(int64_t micro_batch, bool equal_counts) {
  plan_ = ddp::BatchPlan::make(train_.global_batch_size, world_, rank_, micro_batch);
  if (equal_counts) plan_.equalize_micro_batches(micro_batch);
}

void Batches::set_micro_batch(int64_t micro_batch, bool equal_counts) {
  micro_batch_ = micro_batch;
  replan(micro_batch, equal_counts);
}

void Batches::plan_configured(bool equal_counts) { replan(train_.micro_batch_size, equal_counts); }

void Batches::start() {
  // The loader reads this rank's slice of each step; the slice (offset, size) never changes with
  // the micro-batch, so a fallback keeps reading the same samples. The workers get the slice's
  // bounds now, never plan_, which a fallback rewrites on the training thread (set_micro_batch)
  // while they take the coming steps (a data race ThreadSanitizer found: scripts/sanitize.sh).
  loader_ = std::make_unique<data::Loader>(
      dataset_,
      [this, offset = plan_.offset, size = plan_.per_rank](int64_t batch) {
        return take_indices(batch, offset, size);
      },
      loader_options_);
}

at::Tensor Batches::take_indices(int64_t index, int64_t offset, int64_t size) {
  const at::Tensor all = sampler_.indices(index, 0, train_.global_batch_size);
  const at::Tensor mine = all.narrow(0, offset, size);
  StepTargets t{dataset_.target_count(all), mine.clone()};
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  targets_[index] = std::move(t);
  return mine;
}

data::Batch Batches::get(int64_t index) {
  if (rank_ == 0 && !wrap_logged_.empty()) log_wraps(index);
  if (!order_dir_.empty()) record_order(index);
  data::Batch batch = loader_->get(index);
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  targets_.erase(targets_.begin(), targets_.lower_bound(index));  // steps passed
  return batch;
}

double Batches::weight(int64_t index, int64_t offset, int64_t n) const {
  if (n == 0) return 0.0;
  const std::lock_guard<std::mutex> lock(targets_mutex_);
  const StepTargets& t = targets_.at(index);
  const int64_t mine = dataset_.target_count(t.indices.narrow(0, offset, n));
  return static_cast<double>(mine) / static_cast<double>(std::max<int64_t>(1, t.global));
}

data::Batch Batches::micro_batch(const data::Batch& batch, int64_t offset, int64_t n) const {
  // An empty micro-batch (BatchPlan::equalize_micro_batches) runs on the slice's last sample with
  // weight 0 (weight(.., 0)): the same gathers as the other ranks' micro-batch, no gradient.
  if (n == 0) offset = plan_.per_rank - 1, n = 1;
  data::Batch micro = data::to_device(batch, offset, n, device_);
  if (micro.positions.defined() && device_.is_cuda()) {
    micro.positions = batch.positions.narrow(0, offset, n);
  }
  return micro;
}

data::Batch Batches::first_slice() {
  return dataset_.get(sampler_.indices(0, plan_.offset, plan_.per_rank));
}

int64_t Batches::host_bytes(int64_t step_bytes) const {
  return sampler_.buffer_bytes() + data::Loader::buffer_bytes(loader_options_, step_bytes);
}

void Batches::describe_mixture() const {
  std::string line;
  const auto sources = dataset_.sources();
  for (size_t k = 0; k < sources.size(); ++k) {
    const auto& s = sources[k];
    const int64_t wrap = wrap_steps_[k];
    line += fmt::format("{}{} {:.4f} ({} windows, {} validation; {})", k == 0 ? "" : ", ", s.name,
                        s.weight, s.size, s.validation ? s.validation->size() : 0,
                        wrap < 0 ? "never drawn" : fmt::format("first wraps at step {}", wrap + 1));
  }
  spdlog::info("data.mixture: {} sources drawn by weight, each within one sample of its share in "
               "every {} samples: {}",
               sources.size(), ddp::MixtureOrder::kPeriod, line);
}

void Batches::log_wraps(int64_t index) {
  const auto sources = dataset_.sources();
  for (size_t k = 0; k < sources.size(); ++k) {
    if (wrap_logged_[k] || wrap_steps_[k] != index) continue;
    wrap_logged_[k] = true;  // a step read again (a fallback) says nothing more
    spdlog::info("step {}: data source '{}' ran out of its {} windows and wraps around: it goes "
                 "on in a new order (each pass its own)",
                 index + 1, sources[k].name, sources[k].size);
  }
}

void Batches::record_order(int64_t index) {
  const at::Tensor ids = order_sampler_->indices(index, plan_.offset, plan_.per_rank);
  std::ofstream out(fmt::format("{}/rank_{}.txt", order_dir_, rank_), std::ios::app);
  out << index + 1 << ' ' << plan_.offset;
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) out << ' ' << p[i];
  out << '\n';
}

}  // namespace train
