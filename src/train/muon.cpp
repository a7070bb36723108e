#include "train/muon.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "models/capabilities.h"

namespace train {
namespace {

// torch.optim.Muon's (Keller Jordan's quintic: the slope at zero maximised).
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;
constexpr double kEps = 1e-7;

// The learning-rate factor of a rows x cols matrix (torch.optim.Muon's _adjust_lr).
double lr_scale(MuonAdjustLr adjust, int64_t rows, int64_t cols) {
  const double a = double(rows), b = double(cols);
  if (adjust == MuonAdjustLr::kMatchRmsAdamW) return 0.2 * std::sqrt(std::max(a, b));
  return std::sqrt(std::max(1.0, a / b));
}

}  // namespace

MuonTargets muon_targets(models::Model& model) {
  const auto* declared = models::as<models::HiddenMatrices>(model);
  if (declared == nullptr) {
    throw std::invalid_argument(
        "train.optimizer: muon needs a model that names its hidden layers' weight matrices "
        "(models::HiddenMatrices: gpt, llama); this one does not, so use train.optimizer: adamw");
  }
  const auto named = model.named_parameters();
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < named.size(); ++k) index.emplace(named[k].key(), k);
  MuonTargets targets;
  targets.params.assign(named.size(), false);
  std::vector<int64_t> covered(named.size(), 0);  // rows so far, each parameter's from row 0
  for (const models::HiddenMatrix& m : declared->hidden_matrices()) {
    const size_t k = index.at(m.param);
    if (m.row_begin != covered[k]) {
      throw std::logic_error(fmt::format("muon: '{}' does not start where the matrices of '{}' "
                                         "before it end (row {})",
                                         m.name, m.param, covered[k]));
    }
    covered[k] += m.rows;
    targets.params[k] = true;
    targets.matrices.push_back({m.name, k, m.row_begin, m.rows});
  }
  for (size_t k = 0; k < named.size(); ++k) {
    if (targets.params[k] && covered[k] != named[k].value().size(0)) {
      throw std::logic_error(fmt::format("muon: the matrices of '{}' cover {} of its {} rows",
                                         named[k].key(), covered[k], named[k].value().size(0)));
    }
  }
  return targets;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(models::Model& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& item : model.named_parameters()) {
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  }
  return shapes;
}

c10::ScalarType muon_ns_dtype(const TrainOptions& train) {
  switch (train.muon.ns_dtype) {
    case MuonNsDtype::kFp32: return at::kFloat;
    case MuonNsDtype::kBf16: return at::kBFloat16;
    case MuonNsDtype::kFp16: return at::kHalf;
    case MuonNsDtype::kAuto: break;
  }
  return train.precision == Precision::kFp16 ? at::kHalf : at::kBFloat16;
}

double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double m = double(std::min(rows, cols)), n = double(std::max(rows, cols));
  return double(steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

double MuonPlan::flops_of(int rank) const {
  double total = 0;
  for (const auto& m : matrices) total += m.owner == rank ? m.flops : 0.0;
  return total;
}

int64_t MuonPlan::largest_block() const {
  int64_t block = 0;
  for (const auto& c : chunks) block = std::max(block, c.block);
  return block;
}

std::string MuonPlan::describe(c10::ScalarType ns_dtype) const {
  int64_t params = 0;
  for (const auto& m : matrices) params += m.numel();
  std::string owners;
  for (int r = 0; r < world; ++r) {
    const auto n = std::count_if(matrices.begin(), matrices.end(),
                                 [r](const MuonMatrix& m) { return m.owner == r; });
    owners +=
        fmt::format("{}rank {}: {} ({:.3f} GFLOP, {:.2f} MiB of buffers)", r == 0 ? "" : ", ", r, n,
                    flops_of(r) / 1e9, double(muon_buffer_bytes(*this, r, ns_dtype)) / 1048576.0);
  }
  return fmt::format("{} hidden matrices ({:.2f}M parameters) in {} bucket(s), Newton-Schulz "
                     "({} steps, {}) by one owner each, balanced by FLOPs per step: {}",
                     matrices.size(), double(params) / 1e6, chunks.size(), ns_steps,
                     c10::toString(ns_dtype), owners);
}

int64_t muon_buffer_bytes(const MuonPlan& plan, int rank, c10::ScalarType ns_dtype) {
  int64_t x = 0, gram = 0, largest = 0;
  for (const auto& m : plan.matrices) {
    largest = std::max(largest, m.numel());
    if (m.owner != rank) continue;
    x = std::max(x, m.numel());
    gram = std::max(gram, std::min(m.rows, m.cols) * std::min(m.rows, m.cols));
  }
  const int64_t block = plan.largest_block();
  const auto ns = static_cast<int64_t>(c10::elementSize(ns_dtype));
  return ns * ((plan.world + 1) * block + 2 * x + 2 * gram) + 4 * largest;
}

namespace {

// The matrices of each parameter (indices into `targets`), by parameter index.
std::vector<std::vector<size_t>> targets_by_param(const std::vector<MuonTarget>& targets,
                                                  size_t params) {
  std::vector<std::vector<size_t>> of(params);
  for (size_t i = 0; i < targets.size(); ++i) of.at(targets[i].param).push_back(i);
  return of;
}

// Each matrix of `here` (indices into plan.matrices, one bucket's, largest first) to the rank with
// the fewest FLOPs in that bucket so far, ties to the fewest over all buckets (`total`), then the
// lowest rank; returns the bucket's block (the largest owner's elements).
int64_t assign_owners(MuonPlan& plan, const std::vector<size_t>& here, std::vector<double>& total) {
  std::vector<double> load(plan.world, 0.0);
  std::vector<int64_t> filled(plan.world, 0);
  for (const size_t i : here) {
    MuonMatrix& m = plan.matrices[i];
    int best = 0;
    for (int r = 1; r < plan.world; ++r) {
      if (std::tie(load[r], total[r]) < std::tie(load[best], total[best])) best = r;
    }
    m.owner = best;
    m.slot = filled[best];
    filled[best] += m.numel();
    load[best] += m.flops;
    total[best] += m.flops;
  }
  return *std::max_element(filled.begin(), filled.end());
}

}  // namespace

MuonPlan plan_muon(const std::vector<ddp::BucketLayout>& layout,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                   const std::vector<MuonTarget>& targets, int world, int64_t ns_steps) {
  MuonPlan plan;
  plan.world = world;
  plan.ns_steps = ns_steps;
  const auto of = targets_by_param(targets, shapes.size());
  std::vector<double> total(world, 0.0);
  for (size_t b = 0; b < layout.size(); ++b) {
    MuonChunk chunk{b, {}, 0};
    for (const size_t k : layout[b].params) {
      const auto& shape = shapes.at(k).second;
      if (!of[k].empty() && shape.size() != 2) {
        throw std::invalid_argument(
            fmt::format("train.optimizer: muon: '{}' is not a 2-D matrix", shapes.at(k).first));
      }
      for (const size_t t : of[k]) {
        const MuonTarget& target = targets[t];
        chunk.matrices.push_back(plan.matrices.size());
        plan.matrices.push_back({target.name, k, target.row_begin * shape[1], target.rows, shape[1],
                                 plan.chunks.size(), 0, 0,
                                 newton_schulz_flops(target.rows, shape[1], ns_steps)});
      }
    }
    if (chunk.matrices.empty()) continue;
    std::stable_sort(chunk.matrices.begin(), chunk.matrices.end(), [&](size_t x, size_t y) {
      return plan.matrices[x].flops > plan.matrices[y].flops;
    });
    chunk.block = assign_owners(plan, chunk.matrices, total);
    plan.chunks.push_back(std::move(chunk));
  }
  return plan;
}

Muon::Muon(MuonPlan plan, std::vector<MuonPiece> pieces, const MuonOptions& options,
           c10::ScalarType ns_dtype, bool sharded, ddp::Communicator& comm, c10::Device where)
    : plan_(std::move(plan)), pieces_(std::move(pieces)), options_(options), ns_dtype_(ns_dtype),
      sharded_(sharded), comm_(comm) {
  if (plan_.world != comm.size()) {
    throw std::logic_error("Muon: a plan for another number of ranks");
  }
  const at::TensorOptions device = at::TensorOptions().device(where);
  chunk_pieces_.resize(plan_.chunks.size());
  int64_t largest_piece = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    chunk_pieces_.at(plan_.matrices.at(pieces_[i].matrix).chunk).push_back(i);
    largest_piece = std::max(largest_piece, pieces_[i].param.numel());
  }
  int64_t x = 0, gram = 0;  // this rank's largest matrix: X (m x n) and the Gram matrices (m x m)
  for (const auto& m : plan_.matrices) {
    if (m.owner != comm.rank()) continue;
    x = std::max(x, m.numel());
    gram = std::max(gram, std::min(m.rows, m.cols) * std::min(m.rows, m.cols));
  }
  const auto ns = device.dtype(ns_dtype_);
  const int64_t block = plan_.largest_block();
  exchange_ = at::zeros({plan_.world * block}, ns);
  owned_ = at::zeros({block}, ns);
  x_[0] = at::empty({x}, ns);
  x_[1] = at::empty({x}, ns);
  gram_ = at::empty({gram}, ns);
  update_ = at::empty({gram}, ns);
  norm_ = at::empty({}, ns);
  const auto dtype = pieces_.empty() ? at::kFloat : pieces_.front().param.scalar_type();
  scratch_ = at::empty({largest_piece}, device.dtype(dtype));
  skip_ = at::empty({}, device.dtype(at::kBool));
}

int64_t Muon::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : {&exchange_, &owned_, &x_[0], &x_[1], &gram_, &update_, &scratch_}) {
    bytes += t->nbytes();
  }
  return bytes;
}

void Muon::step(double lr, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  at::gt_out(skip_, found_inf.select(0, 0), 0);
  const int rank = comm_.rank();
  for (size_t c = 0; c < plan_.chunks.size(); ++c) {
    const MuonChunk& chunk = plan_.chunks[c];
    const int64_t s = chunk.block;
    accumulate(c);
    if (gathers()) {
      comm_.reduce_scatter(owned_.narrow(0, 0, s), exchange_.narrow(0, 0, plan_.world * s),
                           ddp::ReduceOp::kSum, "muon momentum to owners");
    }
    for (const size_t i : chunk.matrices) {
      const MuonMatrix& m = plan_.matrices[i];
      if (m.owner != rank) continue;
      orthogonalise(m, owned_.narrow(0, m.slot, m.numel()).view({m.rows, m.cols}),
                    exchange_.narrow(0, rank * s + m.slot, m.numel()).view({m.rows, m.cols}));
    }
    if (plan_.world > 1) {
      comm_.all_gather(exchange_.narrow(0, 0, plan_.world * s), exchange_.narrow(0, rank * s, s),
                       "muon updates from owners");
    }
    apply(c, lr);
  }
}

void Muon::accumulate(size_t c) {
  const int64_t s = plan_.chunks[c].block;
  if (gathers()) exchange_.narrow(0, 0, plan_.world * s).zero_();
  for (const size_t i : chunk_pieces_[c]) {
    const MuonPiece& p = pieces_[i];
    const MuonMatrix& m = plan_.matrices[p.matrix];
    // B <- B + (1 - mu) (G - B), unless the step is skipped (a non-finite G must not reach B).
    at::Tensor next = scratch_.narrow(0, 0, p.param.numel());
    at::Tensor momentum = p.momentum;
    at::lerp_out(next, momentum, p.grad, 1.0 - options_.momentum);
    at::where_out(momentum, skip_, momentum, next);
    // U, in the Newton-Schulz dtype, where the owner reads it.
    at::Tensor to;
    if (gathers()) {
      to = exchange_.narrow(0, m.owner * s + m.slot + p.offset, p.param.numel());
    } else if (m.owner == comm_.rank()) {
      to = owned_.narrow(0, m.slot + p.offset, p.param.numel());
    } else {
      continue;
    }
    if (options_.nesterov) {
      at::lerp_out(to, p.grad, p.momentum, options_.momentum);
    } else {
      to.copy_(p.momentum);
    }
  }
}

void Muon::orthogonalise(const MuonMatrix& m, const at::Tensor& from, const at::Tensor& to) {
  // As torch.optim.Muon's _zeropower_via_newtonschulz, op for op (the same kernels on the same
  // layouts): the wide orientation, scaled to a spectral norm of at most 1, then the iterations.
  const bool tall = m.rows > m.cols;
  const int64_t rows = std::min(m.rows, m.cols), cols = std::max(m.rows, m.cols);
  at::Tensor x = tall ? from.t() : from;
  at::linalg_vector_norm_out(norm_, x, 2);
  norm_.clamp_min_(kEps);
  x.div_(norm_);
  at::Tensor gram = gram_.narrow(0, 0, rows * rows).view({rows, rows});
  at::Tensor update = update_.narrow(0, 0, rows * rows).view({rows, rows});
  for (int64_t k = 0; k < plan_.ns_steps; ++k) {
    at::Tensor next = x_[k % 2].narrow(0, 0, rows * cols).view({rows, cols});
    at::mm_out(gram, x, x.t());
    at::addmm_out(update, gram, gram, gram, kB, kC);
    at::addmm_out(next, x, update, x, kA, 1.0);
    x = next;
  }
  to.copy_(tall ? x.t() : x);
  ++calls_;
}

void Muon::apply(size_t c, double lr) {
  const int64_t s = plan_.chunks[c].block;
  for (const size_t i : chunk_pieces_[c]) {
    const MuonPiece& p = pieces_[i];
    const MuonMatrix& m = plan_.matrices[p.matrix];
    const at::Tensor o = exchange_.narrow(0, m.owner * s + m.slot + p.offset, p.param.numel());
    // W <- W (1 - lr wd) - lr s O, as torch.optim.Muon's mul_ and add_; skipped: W stays.
    at::Tensor next = scratch_.narrow(0, 0, p.param.numel());
    at::mul_out(next, p.param, 1.0 - lr * options_.weight_decay);
    at::add_out(next, next, o, -lr * lr_scale(options_.adjust_lr, m.rows, m.cols));
    at::Tensor param = p.param;
    at::where_out(param, skip_, param, next);
  }
}

}  // namespace train
