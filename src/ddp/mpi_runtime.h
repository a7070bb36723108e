// MpiRuntime: the process's MPI session (MPI_Init_thread .. MPI_Finalize), the job's topology,
// and the communicators built on MPI. MPI is the control plane of the job: bootstrap, small
// votes, and the data plane for CPU tensors.
//
// One MpiRuntime per process, created before any other ddp object and destroyed last. Its
// destructor finalises MPI, except while an exception unwinds (then a peer may be gone, and the
// code that catches the exception must call abort()). Not copyable or movable.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddp/communicator.h"

namespace ddp {

// The environment variable that makes MpiRuntime pretend every K consecutive ranks form a node
// (tests only: the mpi tier runs on one machine); the last node runs what is left when K does not
// divide the world size (uneven nodes). Ignored when K is not in [1, world size].
inline constexpr const char* kTestRanksPerNodeEnv = "TRAINER_TEST_RANKS_PER_NODE";

// What MPI itself says about this process's place in the job.
struct MpiTopology {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among processes sharing this node (MPI_COMM_TYPE_SHARED)
  int local_size = 1;
  // The node as hybrid sharding's communicators see it (MpiRuntime::node, cross_node): the real
  // one above, or kTestRanksPerNodeEnv's. Device and CPU binding use local_rank / local_size.
  int node_rank = 0;          // rank in MpiRuntime::node()
  int node_size = 1;          // ranks of this node
  int node = 0;               // this node's index, rank in MpiRuntime::cross_node()
  int num_nodes = 1;          // size of MpiRuntime::cross_node(); all of them when uniform_nodes
  bool uniform_nodes = true;  // every node runs node_size ranks (hybrid sharding needs it)
  std::string hostname;
};

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime() noexcept;
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const MpiTopology& topology() const { return topology_; }
  // Communicators over every rank of the job, and over this process alone (world size 1).
  std::unique_ptr<Communicator> world(std::chrono::duration<double> timeout) const;
  std::unique_ptr<Communicator> self(std::chrono::duration<double> timeout) const;
  // The communicators of hybrid sharding: over this node's ranks (rank = node_rank), and over
  // the ranks of every node with this process's node_rank (rank = node). Each call makes a new
  // one, as world() does; creating one is collective over the ranks it spans.
  std::unique_ptr<Communicator> node(std::chrono::duration<double> timeout) const;
  std::unique_ptr<Communicator> cross_node(std::chrono::duration<double> timeout) const;

  // Starts the thread that drives non-blocking operations while the training thread computes
  // (ddp/mpi_progress.h; stopped before MPI_Finalize). False, and nothing started, when MPI
  // did not provide MPI_THREAD_MULTIPLE.
  bool start_progress_thread(std::chrono::microseconds poll);

  // Ends every process of the job with `code`. For failures after which ranks can no longer
  // agree (a timeout, an error on one rank in the middle of a step).
  [[noreturn]] static void abort(int code) noexcept;

 private:
  void split_nodes();

  MpiTopology topology_;
  bool thread_multiple_ = false;
  // The node and cross-node MPI communicators, made once by split_nodes() and freed before
  // MPI_Finalize (defined in the .cpp, which keeps mpi.h out of this header).
  struct NodeComms;
  std::unique_ptr<NodeComms> node_comms_;
};

}  // namespace ddp
