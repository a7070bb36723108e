#include "train/trainer.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize/output-archive.h>

#include <chrono>
#include <filesystem>
#include <limits>

#include "memory/process_memory.h"
#include "train/schedule.h"

namespace train {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

Trainer::Trainer(const TrainOptions& options, const ddp::DdpOptions& ddp,
                 const CheckpointOptions& checkpoint, const LogOptions& log,
                 ddp::Communicator& control, ddp::Communicator& data,
                 std::shared_ptr<models::Model> model, const data::Dataset& dataset,
                 c10::Device device)
    : options_(options), checkpoint_(checkpoint), log_(log), control_(control), data_(data),
      model_(std::move(model)), dataset_(dataset), device_(device),
      plan_(ddp::BatchPlan::make(options.global_batch_size, control.size(), control.rank(),
                                 options.micro_batch_size)),
      sampler_(dataset.size(), options.global_batch_size, options.seed) {
  model_->to(device_);
  ddp::NamedParameters named;
  for (auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  // Persistent state is allocated before step 1 (DESIGN.md, OOM protocol): the Reducer's
  // gradient buckets now, the optimizer's state on its first step.
  reducer_ = std::make_unique<ddp::Reducer>(
      std::move(named), data_,
      ddp::ReducerOptions{static_cast<int64_t>(ddp.first_bucket_mb * (1 << 20)),
                          static_cast<int64_t>(ddp.bucket_mb * (1 << 20)),
                          ddp.find_unused_parameters});
  broadcast_model();
  params_ = model_->parameters();
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      params_, torch::optim::AdamWOptions(options_.lr)
                   .betas({options_.beta1, options_.beta2})
                   .eps(options_.eps)
                   .weight_decay(options_.weight_decay));
}

void Trainer::broadcast_model() {
  at::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) {
    data_.broadcast(item.value().data(), 0, "parameter " + item.key());
  }
  for (auto& item : model_->named_buffers()) data_.broadcast(item.value(), 0, "buffer " + item.key());
}

StepResult Trainer::step(int64_t step, bool stop_requested) {
  control_.set_step(step);
  data_.set_step(step);
  reducer_->zero_grad();

  const data::Batch batch = dataset_.get(sampler_.indices(step, plan_.offset, plan_.per_rank));
  at::Tensor local_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  int64_t offset = 0;
  for (size_t m = 0; m < plan_.micro_sizes.size(); ++m) {
    const int64_t n = plan_.micro_sizes[m];
    // Only the last micro-batch's backward communicates (earlier ones accumulate: no_sync).
    reducer_->begin_micro_batch(/*sync=*/m + 1 == plan_.micro_sizes.size());
    const auto inputs = batch.inputs.narrow(0, offset, n).to(device_, /*non_blocking=*/true);
    const auto targets = batch.targets.narrow(0, offset, n).to(device_, /*non_blocking=*/true);
    // Weighted by its share of the global batch: the SUM over ranks is the global mean.
    const at::Tensor loss = model_->loss(inputs, targets) * plan_.weight(n);
    loss.backward();
    local_loss += loss.detach().to(at::kDouble);
    offset += n;
  }
  reducer_->finish();

  // Status vote: one small all-reduce every step carrying the loss and any stop request.
  at::Tensor vote = at::stack({local_loss.cpu(), at::scalar_tensor(stop_requested ? 1.0 : 0.0,
                                                                   at::kDouble)});
  control_.all_reduce(vote, ddp::ReduceOp::kSum, "status vote");

  StepResult r;
  r.loss = vote[0].item<double>();
  r.stop = vote[1].item<double>() > 0;
  r.lr = learning_rate(step, options_.steps, options_.warmup_steps, options_.lr,
                       options_.min_lr_ratio);
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(r.lr);
  }
  const double max_norm =
      options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
  r.grad_norm = torch::nn::utils::clip_grad_norm_(params_, max_norm);
  optimizer_->step();
  return r;
}

RunSummary Trainer::run(const std::function<bool()>& stop_requested) {
  RunSummary summary;
  spdlog::info("training {} steps, global batch {} on {} rank(s); rank {}: {}", options_.steps,
               plan_.global_batch, plan_.world_size, plan_.rank, plan_.describe());
  auto window_start = Clock::now();
  auto steady_start = Clock::now();
  int64_t window_steps = 0;
  for (int64_t s = 0; s < options_.steps; ++s) {
    const StepResult r = step(s, stop_requested && stop_requested());
    ++window_steps;
    summary.steps_done = s + 1;
    if (s == 0) {
      summary.first_loss = r.loss;
      steady_start = Clock::now();
    }
    summary.last_loss = r.loss;
    const bool last = s + 1 == options_.steps || r.stop;
    if (s == 0 || (s + 1) % log_.every == 0 || last) {
      const double elapsed = seconds_since(window_start);
      const auto mem = memory::sample_process_memory();
      spdlog::info("step {:>5}/{} loss {:.4f} lr {:.3e} grad_norm {:.3f} {:>9.1f} samples/s rss {:.0f} MiB",
                   s + 1, options_.steps, r.loss, r.lr, r.grad_norm,
                   window_steps * plan_.global_batch / elapsed, mem.resident_bytes / 1048576.0);
      window_start = Clock::now();
      window_steps = 0;
    }
    if (!checkpoint_.dir.empty() && checkpoint_.every > 0 && (s + 1) % checkpoint_.every == 0) {
      save_checkpoint(fmt::format("{}/step_{:06d}.pt", checkpoint_.dir, s + 1));
    }
    if (r.stop) {
      spdlog::warn("stop requested (signal): stopping after step {}", s + 1);
      summary.stopped = true;
      break;
    }
  }
  if (summary.steps_done > 1) {
    summary.samples_per_s =
        (summary.steps_done - 1) * plan_.global_batch / seconds_since(steady_start);
  }
  if (!checkpoint_.dir.empty()) save_checkpoint(checkpoint_.dir + "/final.pt");
  return summary;
}

void Trainer::save_checkpoint(const std::string& path) const {
  if (control_.rank() != 0) return;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  torch::serialize::OutputArchive archive;
  model_->save(archive);
  archive.save_to(path);
  spdlog::info("checkpoint written: {}", path);
}

}  // namespace train
