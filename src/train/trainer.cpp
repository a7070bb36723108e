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

Trainer::Trainer(const TrainOptions& options, const CheckpointOptions& checkpoint,
                 const LogOptions& log, ddp::Communicator& comm,
                 std::shared_ptr<models::Model> model, const data::Dataset& dataset,
                 c10::Device device)
    : options_(options), checkpoint_(checkpoint), log_(log), comm_(comm),
      model_(std::move(model)), dataset_(dataset), device_(device),
      plan_(ddp::BatchPlan::make(options.global_batch_size, comm.size(), comm.rank(),
                                 options.micro_batch_size)),
      sampler_(dataset.size(), options.global_batch_size, options.seed) {
  model_->to(device_);
  broadcast_model();
  params_ = model_->parameters();
  // Persistent state is allocated before step 1 (DESIGN.md, OOM protocol): gradients now.
  for (auto& p : params_) p.mutable_grad() = at::zeros_like(p);
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      params_, torch::optim::AdamWOptions(options_.lr)
                   .betas({options_.beta1, options_.beta2})
                   .eps(options_.eps)
                   .weight_decay(options_.weight_decay));
}

void Trainer::broadcast_model() {
  at::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) {
    comm_.broadcast(item.value().data(), 0, "parameter " + item.key());
  }
  for (auto& item : model_->named_buffers()) comm_.broadcast(item.value(), 0, "buffer " + item.key());
}

void Trainer::all_reduce_gradients() {
  // One flat SUM all-reduce over every gradient (the bucketed, overlapped Reducer replaces it).
  std::vector<at::Tensor> flat_grads;
  flat_grads.reserve(params_.size());
  for (auto& p : params_) flat_grads.push_back(p.grad().reshape(-1));
  at::Tensor flat = at::cat(flat_grads);
  comm_.all_reduce(flat, ddp::ReduceOp::kSum, "gradients");
  int64_t offset = 0;
  for (auto& p : params_) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p));
    offset += n;
  }
}

StepResult Trainer::step(int64_t step, bool stop_requested) {
  comm_.set_step(step);
  for (auto& p : params_) p.mutable_grad().zero_();

  const data::Batch batch = dataset_.get(sampler_.indices(step, plan_.offset, plan_.per_rank));
  at::Tensor local_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  int64_t offset = 0;
  for (const int64_t n : plan_.micro_sizes) {
    const auto inputs = batch.inputs.narrow(0, offset, n).to(device_, /*non_blocking=*/true);
    const auto targets = batch.targets.narrow(0, offset, n).to(device_, /*non_blocking=*/true);
    // Weighted by its share of the global batch: the SUM over ranks is the global mean.
    const at::Tensor loss = model_->loss(inputs, targets) * plan_.weight(n);
    loss.backward();
    local_loss += loss.detach().to(at::kDouble);
    offset += n;
  }
  all_reduce_gradients();

  // Status vote: one small all-reduce every step carrying the loss and any stop request.
  at::Tensor vote = at::stack({local_loss.cpu(), at::scalar_tensor(stop_requested ? 1.0 : 0.0,
                                                                   at::kDouble)});
  comm_.all_reduce(vote, ddp::ReduceOp::kSum, "status vote");

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
  if (comm_.rank() != 0) return;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  torch::serialize::OutputArchive archive;
  model_->save(archive);
  archive.save_to(path);
  spdlog::info("checkpoint written: {}", path);
}

}  // namespace train
