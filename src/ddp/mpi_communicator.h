// MpiCommunicator: Communicator over an MPI communicator, for CPU tensors (CUDA tensors are
// staged through host memory; the NCCL communicator is the fast path for those).
//
// Every operation is posted non-blocking (MPI_Iallreduce, ...) and its Work polls MPI_Test until
// completion or the deadline. Open MPI progresses non-blocking collectives only inside MPI calls,
// so is_completed() is also how callers drive progress while they compute.
#pragma once

#include <mpi.h>

#include "ddp/communicator.h"
#include "ddp/desync.h"

namespace ddp {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm`, so this communicator's traffic never mixes with other users of it.
  // Operations are recorded for desync diagnosis (ddp/desync.h) when `comm` spans the whole job,
  // or when `tracked`: a communicator every rank creates in the same order, with the same role
  // on every rank (MpiRuntime::node / cross_node), so its tracker id names that role everywhere.
  MpiCommunicator(MPI_Comm comm, std::chrono::duration<double> timeout, bool tracked = false);
  ~MpiCommunicator() noexcept override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  WorkPtr all_reduce_async(at::Tensor tensor, ReduceOp op, std::string_view what) override;
  WorkPtr broadcast_async(at::Tensor tensor, int root, std::string_view what) override;
  WorkPtr all_gather_async(at::Tensor output, at::Tensor input, std::string_view what) override;
  WorkPtr reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op,
                               std::string_view what) override;
  WorkPtr barrier_async(std::string_view what) override;

  // A new communicator over the same ranks, with its own MPI context. Collective.
  std::unique_ptr<MpiCommunicator> duplicate(std::chrono::duration<double> timeout) const;

  // The job's ranks on this node, for every communicator made afterwards: with more of them than
  // cores, a waiting communicator yields the core between polls. MpiRuntime sets it from its
  // node-local split at start-up (before it, one rank).
  static void set_ranks_on_node(int ranks);

  // Records this communicator's operations for the desync diagnosis (ddp/desync.h); null unless
  // it spans every rank of the job.
  const std::shared_ptr<desync::Tracker>& tracker() const { return tracker_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool oversubscribed_ = false;  // more ranks on this node than cores: yield while polling
  std::shared_ptr<desync::Tracker> tracker_;
};

}  // namespace ddp
