// Muon (train.optimizer: muon) for the hidden layers' 2-D weight matrices
// (models::HiddenMatrices), beside AdamW for every other parameter (train/optimizer.h). A matrix
// is what Hugging Face stores as one: a parameter, or a row range of a fused one (llama's q_proj,
// k_proj and v_proj of qkv_proj, each orthogonalised and scaled on its own, as torch.optim.Muon
// over the Hugging Face model does); its elements are contiguous in the parameter. The
// update of a matrix W with gradient G, as torch.optim.Muon defines it:
//   B <- mu B + (1 - mu) G                       (B.lerp_(G, 1 - mu): the momentum buffer)
//   U <- nesterov ? G + mu (B - G) : B            (G.lerp(B, mu))
//   O <- NS(U): X = U / max(||U||_F, eps), transposed when it has more rows than columns, then
//        5 times  A = X X^T,  X <- a X + (b A + c A A) X,  (a, b, c) = (3.4445, -4.7750, 2.0315)
//   W <- W (1 - lr wd) - lr s O,   s = sqrt(max(1, rows / cols))  (or 0.2 sqrt(max(rows, cols)))
// Newton-Schulz runs in train.muon_ns_dtype (auto: bf16, as torch.optim.Muon does; fp16 under
// train.precision fp16); the rest in the parameters' dtype.
//
// Note [Muon on every sharding mode]
// Newton-Schulz needs each matrix whole, while the Reducer's buckets are cut into per-rank blocks
// (ddp/shard.h) that split matrices anywhere. So each matrix has one owner rank, which computes
// its update whole (MuonPlan: owners balanced by Newton-Schulz FLOPs, the same plan on every rank),
// and the elementwise parts run where the elements are:
// - The momentum lives in AdamW's first moment (FusedAdamW::exp_avgs(): one per parameter, or the
//   rank's block of each bucket), so it is sharded, checkpointed ("muon.momentum.<name>") and
//   resharded by the fallback rungs exactly as AdamW's moments are. Each rank updates the
//   momentum of the elements it holds (sharded: its blocks; none: every element, replicated as
//   AdamW's moments are) and writes U of those elements, in the Newton-Schulz dtype, into the
//   exchange buffer at the owner's place.
// - Per bucket holding matrices, in bucket order: sharded, one SUM reduce-scatter gives each
//   owner its matrices' U whole (every element comes from the one rank that holds it; the others
//   add zeros); unsharded, the owner holds U already. The owner runs Newton-Schulz, once per
//   matrix world-wide, and one all-gather brings every O to every rank, which applies it to the
//   elements it holds (sharded: its blocks of the parameters, which gather_parameters() or the
//   units' gathers then spread as after AdamW). No rank runs Newton-Schulz on a fragment.
// - With one rank nothing is posted.
// - A step the loss scaler or the norm rejects (found_inf) leaves the momentum and parameters as
//   they were, decided on the device (torch.where), as FusedAdamW's kernel skips.
// - Hybrid sharding (ddp.shard_group: node): the owners are a node's ranks; every node computes
//   the same updates.
// The exchange buffers (the ranks' blocks of one bucket's matrices), the Newton-Schulz workspace
// of this rank's largest matrix and one scratch piece are allocated at construction, before
// step 1; step() allocates nothing on the device and reads nothing from it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/buckets.h"
#include "ddp/communicator.h"
#include "models/model.h"
#include "train/options.h"

namespace train {

// One matrix Muon optimises: the parameter's elements [begin, begin + rows * cols) (row-major),
// and where its update is computed.
struct MuonMatrix {
  std::string name;
  size_t param = 0;   // index into the parameter list
  int64_t begin = 0;  // its first element in the parameter (row_begin * cols)
  int64_t rows = 0, cols = 0;
  size_t chunk = 0;  // the MuonPlan chunk (bucket) it lies in
  int owner = 0;     // the rank that runs its Newton-Schulz
  int64_t slot = 0;  // its first element in the owner's block of the chunk's exchange
  double flops = 0;  // Newton-Schulz FLOPs per step
  int64_t numel() const { return rows * cols; }
};

// The matrices of one bucket, exchanged together.
struct MuonChunk {
  size_t bucket = 0;
  std::vector<size_t> matrices;  // indices into MuonPlan::matrices, in assignment order
  int64_t block = 0;             // elements per rank in its exchange (the largest owner's)
};

// Who orthogonalises what: a pure function of the bucket layout, the matrices' shapes and the
// world size, so every rank computes the same plan. Within each bucket, the matrices are taken
// largest first (by Newton-Schulz FLOPs) and each goes to the rank with the fewest FLOPs in that
// bucket so far, ties to the rank with the fewest over all buckets, then the lowest rank.
struct MuonPlan {
  std::vector<MuonMatrix> matrices;  // in bucket order
  std::vector<MuonChunk> chunks;     // the buckets holding matrices, in bucket order
  int world = 1;
  int64_t ns_steps = 0;

  // FLOPs and matrices of `rank`.
  double flops_of(int rank) const;
  int64_t largest_block() const;
  // One line: matrices, parameters, and each rank's matrices, GFLOP per step and the bytes of
  // its buffers (muon_buffer_bytes: what the memory plan counts) with Newton-Schulz in `ns_dtype`.
  std::string describe(c10::ScalarType ns_dtype) const;
};

// What Muon optimises of a model (models::HiddenMatrices, by parameter index).
struct MuonTarget {
  std::string name;  // Hugging Face's
  size_t param = 0;  // index into the parameter list (named_parameters() order)
  int64_t row_begin = 0, rows = 0;
};
struct MuonTargets {
  std::vector<bool> params;          // per parameter: Muon updates it (all its rows)
  std::vector<MuonTarget> matrices;  // in parameter order, by rows within one
};

// `shapes`: every parameter's shape (names too); `targets`: the matrices Muon optimises, rows of
// 2-D parameters.
MuonPlan plan_muon(const std::vector<ddp::BucketLayout>& layout,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                   const std::vector<MuonTarget>& targets, int world, int64_t ns_steps);

// The bytes a Muon of `plan` allocates on `rank` (Muon::state_bytes(), with its scratch piece
// bounded by the largest matrix): the memory plan's, before anything is allocated.
int64_t muon_buffer_bytes(const MuonPlan& plan, int rank, c10::ScalarType ns_dtype);

// The model's hidden matrices (models::HiddenMatrices) by parameter index, checked to cover each
// of their parameters' rows once. Throws std::invalid_argument (exit 2) naming train.optimizer
// when the model names none.
MuonTargets muon_targets(models::Model& model);
// Every parameter's name and shape, as plan_muon takes them.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(models::Model& model);
// train.muon_ns_dtype resolved: auto is bf16 (torch.optim.Muon's), fp16 under train.precision fp16.
c10::ScalarType muon_ns_dtype(const TrainOptions& train);

// Newton-Schulz FLOPs of one rows x cols matrix: per iteration 4 m^2 n + 2 m^3 (m <= n).
double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps);

// The elements [offset, offset + param.numel()) of a matrix (row-major, from its first element
// MuonMatrix::begin of the parameter) that this rank holds:
// 1-D views of the parameter (or its master block), the reduced gradient and the momentum (the
// AdamW first moment's same elements).
struct MuonPiece {
  size_t matrix = 0;  // index into MuonPlan::matrices
  int64_t offset = 0;
  at::Tensor param, grad, momentum;
};

class Muon {
 public:
  // `comm`: the ranks the plan spans (the shard group); `sharded`: the pieces are the ranks'
  // blocks (else every rank holds every matrix whole). Allocates the exchange buffers and this
  // rank's workspaces on `device`.
  Muon(MuonPlan plan, std::vector<MuonPiece> pieces, const MuonOptions& options,
       c10::ScalarType ns_dtype, bool sharded, ddp::Communicator& comm, c10::Device device);

  // One update at the group's learning rate `lr`; `found_inf` (float [1] on the device, 1: skip)
  // leaves everything as it was. Collective (world > 1): per bucket of matrices, a reduce-scatter
  // (sharded) and an all-gather, in bucket order.
  void step(double lr, const at::Tensor& found_inf);

  const MuonPlan& plan() const { return plan_; }
  // Newton-Schulz runs on this rank so far (one per owned matrix per step).
  int64_t newton_schulz_calls() const { return calls_; }
  // Bytes Muon allocated: the exchange buffers, the workspace and the scratch piece (the
  // momentum is AdamW's first moment: FusedAdamW::state_bytes()).
  int64_t state_bytes() const;
  c10::ScalarType ns_dtype() const { return ns_dtype_; }

 private:
  // Momentum of this rank's pieces of chunk `c`, and U into the exchange.
  void accumulate(size_t c);
  // Newton-Schulz of `m` from its U (in `from`) into its O (`to`, rows x cols).
  void orthogonalise(const MuonMatrix& m, const at::Tensor& from, const at::Tensor& to);
  // The pieces of chunk `c` updated from the gathered O.
  void apply(size_t c, double lr);
  bool gathers() const { return sharded_ && plan_.world > 1; }

  MuonPlan plan_;
  std::vector<MuonPiece> pieces_;
  std::vector<std::vector<size_t>> chunk_pieces_;  // per chunk: indices into pieces_
  MuonOptions options_;
  c10::ScalarType ns_dtype_;
  bool sharded_;
  ddp::Communicator& comm_;
  at::Tensor exchange_;  // world x largest block (Newton-Schulz dtype): U, then every O
  at::Tensor owned_;     // largest block: this rank's matrices' U after the reduce-scatter
  at::Tensor x_[2], gram_, update_;  // Newton-Schulz workspace of this rank's largest matrix
  at::Tensor norm_;                  // 0-dim, Newton-Schulz dtype
  at::Tensor scratch_;               // the largest piece, parameters' dtype
  at::Tensor skip_;                  // 0-dim bool: this step is skipped
  int64_t calls_ = 0;
};

}  // namespace train
