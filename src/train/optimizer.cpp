#include "train/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <stdexcept>

namespace train {

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, AdamWHyper hyper)
    : params_(std::move(params)), hyper_(hyper) {
  if (params_.empty()) throw std::invalid_argument("FusedAdamW: no parameters");
  const auto device = params_.front().device();
  // The fused kernel reads the step from a float32 tensor on the parameters' device.
  const at::Tensor count = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& p : params_) {
    if (p.device() != device) {
      throw std::invalid_argument("FusedAdamW: parameters on more than one device");
    }
    exp_avgs_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    exp_avg_sqs_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    step_counts_.push_back(count);
  }
}

void FusedAdamW::step(double lr) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (const auto& p : params_) {
    if (!p.grad().defined()) throw std::logic_error("FusedAdamW: a parameter has no gradient");
    grads.push_back(p.grad());
  }
  ++steps_;
  // fill_ takes the scalar as it is; add_(1) would wrap it in a tensor first (an allocation).
  step_counts_.front().fill_(static_cast<double>(steps_));
  at::_fused_adamw_(params_, grads, exp_avgs_, exp_avg_sqs_, /*max_exp_avg_sqs=*/{}, step_counts_,
                    lr, hyper_.beta1, hyper_.beta2, hyper_.weight_decay, hyper_.eps,
                    /*amsgrad=*/false, /*maximize=*/false);
}

int64_t FusedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) bytes += exp_avgs_[i].nbytes() + exp_avg_sqs_[i].nbytes();
  return bytes;
}

GradClipper::GradClipper(std::vector<at::Tensor> flat_grads) : grads_(std::move(flat_grads)) {
  const auto device = grads_.empty() ? c10::Device(c10::kCPU) : grads_.front().device();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  norms_ = at::zeros({static_cast<int64_t>(grads_.size())}, options);
  total_ = at::zeros({}, options);
}

double GradClipper::clip(double max_norm) {
  if (grads_.empty()) return 0;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < grads_.size(); ++i) {
    at::Tensor slot = norms_.select(0, static_cast<int64_t>(i));
    at::linalg_vector_norm_out(slot, grads_[i], 2, std::nullopt, false, at::kFloat);
  }
  at::linalg_vector_norm_out(total_, norms_, 2);
  const double norm = total_.item<double>();
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  const double scale = max_norm / (norm + 1e-6);
  if (max_norm > 0 && scale < 1) {
    for (auto& g : grads_) g.mul_(scale);
  }
  return norm;
}

}  // namespace train
