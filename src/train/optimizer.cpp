#include "train/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <stdexcept>

namespace train {

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, AdamWHyper hyper,
                       std::vector<at::Tensor> grads, std::vector<ElementRanges> updates)
    : params_(std::move(params)), grads_(std::move(grads)), hyper_(hyper) {
  if (params_.empty()) throw std::invalid_argument("FusedAdamW: no parameters");
  if (!grads_.empty() && grads_.size() != params_.size()) {
    throw std::invalid_argument("FusedAdamW: one gradient per parameter");
  }
  if (!updates.empty() && updates.size() != params_.size()) {
    throw std::invalid_argument("FusedAdamW: one list of ranges per parameter");
  }
  const auto device = params_.front().device();
  // The fused kernel reads the step from a float32 tensor on the parameters' device.
  count_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (p.device() != device) {
      throw std::invalid_argument("FusedAdamW: parameters on more than one device");
    }
    // In the parameter's own layout (channels-last weights too): the fused kernel walks
    // parameter, gradient and moments as flat memory.
    exp_avgs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    exp_avg_sqs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    for (const auto& [b, e] : updates.empty() ? ElementRanges{{0, p.numel()}} : updates[i]) {
      if (b >= e) continue;
      const Piece piece{i, b, e, b == 0 && e == p.numel()};
      if (!piece.whole && p.dim() != 1) {
        throw std::invalid_argument("FusedAdamW: a range of a parameter that is not 1-D");
      }
      pieces_.push_back(piece);
      piece_params_.push_back(cut(p, piece));
      piece_exp_avgs_.push_back(cut(exp_avgs_[i], piece));
      piece_exp_avg_sqs_.push_back(cut(exp_avg_sqs_[i], piece));
      step_counts_.push_back(count_);
    }
  }
}

at::Tensor FusedAdamW::cut(const at::Tensor& t, const Piece& piece) {
  return piece.whole ? t : t.narrow(0, piece.begin, piece.end - piece.begin);
}

std::vector<at::Tensor> FusedAdamW::piece_grads() const {
  std::vector<at::Tensor> grads;
  grads.reserve(pieces_.size());
  for (const Piece& piece : pieces_) {
    const at::Tensor& g = grads_.empty() ? params_[piece.param].grad() : grads_[piece.param];
    if (!g.defined()) throw std::logic_error("FusedAdamW: a parameter has no gradient");
    grads.push_back(cut(g, piece));
  }
  return grads;
}

void FusedAdamW::set_steps(int64_t steps) {
  steps_ = steps;
  count_.fill_(static_cast<double>(steps_));
}

void FusedAdamW::step(double lr, const at::Tensor* found_inf) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = piece_grads();
  ++steps_;
  if (found_inf == nullptr) {
    // fill_ takes the scalar as it is; add_(1) would wrap it in a tensor first (an allocation).
    count_.fill_(static_cast<double>(steps_));
    if (pieces_.empty()) return;
    at::_fused_adamw_(piece_params_, grads, piece_exp_avgs_, piece_exp_avg_sqs_,
                      /*max_exp_avg_sqs=*/{}, step_counts_, lr, hyper_.beta1, hyper_.beta2,
                      hyper_.weight_decay, hyper_.eps, /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
  // As torch.optim.AdamW(fused=True) with a GradScaler: count the step, let the kernel skip the
  // update where found_inf is set, and take the count back for a skipped step, all on the device.
  count_.add_(1);
  if (!pieces_.empty()) {
    at::_fused_adamw_(piece_params_, grads, piece_exp_avgs_, piece_exp_avg_sqs_,
                      /*max_exp_avg_sqs=*/{}, step_counts_, lr, hyper_.beta1, hyper_.beta2,
                      hyper_.weight_decay, hyper_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, *found_inf);
  }
  count_.sub_(found_inf->select(0, 0));  // a 0-dim view of the [1] verdict
}

int64_t FusedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    bytes += exp_avgs_[i].nbytes() + exp_avg_sqs_[i].nbytes();
  return bytes;
}

GradClipper::GradClipper(std::vector<at::Tensor> flat_grads, ddp::Communicator* sum_over,
                         int64_t rider_slots, int replicas)
    : grads_(std::move(flat_grads)), sum_over_(sum_over), replicas_(replicas) {
  const auto device = grads_.empty() ? c10::Device(c10::kCPU) : grads_.front().device();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  norms_ = at::zeros({static_cast<int64_t>(grads_.size())}, options);
  reduced_ = at::zeros({1 + (sum_over != nullptr ? rider_slots : 0)}, options);
  total_ = reduced_.select(0, 0);
  if (reduced_.numel() > 1) rider_ = reduced_.narrow(0, 1, reduced_.numel() - 1);
  coef_ = at::zeros({}, options);
}

void GradClipper::clip(double max_norm) {
  if (grads_.empty()) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < grads_.size(); ++i) {
    at::Tensor slot = norms_.select(0, static_cast<int64_t>(i));
    at::linalg_vector_norm_out(slot, grads_[i], 2, std::nullopt, false, at::kFloat);
  }
  at::linalg_vector_norm_out(total_, norms_, 2);
  if (sum_over_ != nullptr) {  // this rank's blocks only: sqrt(sum over ranks of norm^2)
    total_.square_();
    sum_over_->all_reduce(reduced_, ddp::ReduceOp::kSum, "gradient norm");
    if (replicas_ > 1) total_.div_(replicas_);
    total_.sqrt_();
  }
  if (max_norm <= 0) return;
  // As torch.nn.utils.clip_grad_norm_: multiply by min(1, max_norm / (norm + 1e-6)), computed on
  // the device (a factor of exactly 1 leaves the gradients bitwise unchanged).
  coef_.copy_(total_);
  coef_.add_(1e-6).reciprocal_().mul_(max_norm).clamp_max_(1.0);
  at::_foreach_mul_(grads_, coef_);
}

}  // namespace train
