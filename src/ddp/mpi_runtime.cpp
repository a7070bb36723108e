#include "ddp/mpi_runtime.h"

#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <exception>

#include "ddp/check.h"
#include "ddp/desync.h"
#include "ddp/mpi_communicator.h"
#include "ddp/mpi_progress.h"

namespace ddp {
namespace {

// kTestRanksPerNodeEnv's value, or 0 when unset, malformed or not a divisor of the world size.
int test_ranks_per_node(int world_size) {
  const char* value = std::getenv(kTestRanksPerNodeEnv);
  if (value == nullptr) return 0;
  char* end = nullptr;
  const long k = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || k < 1 || k > world_size) return 0;
  return static_cast<int>(k);
}

}  // namespace

struct MpiRuntime::NodeComms {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm cross_node = MPI_COMM_NULL;
  ~NodeComms() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (cross_node != MPI_COMM_NULL) MPI_Comm_free(&cross_node);
  }
};

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // Gradients travel as MPI_Iallreduce (non-blocking, so they have deadlines), which Open MPI runs
  // in its libnbc component. Its default for small worlds is a binomial tree: 0.6x the bandwidth
  // of blocking MPI_Allreduce on 1-64 MB buffers here; ring matches it (bench/RESULTS.md). A
  // user's own choice (environment or mpirun --mca) wins: setenv does not overwrite.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
  // MPI_THREAD_MULTIPLE lets the progress thread (ddp/mpi_progress.h) test requests while the
  // training thread makes MPI calls of its own.
  int provided = 0;
  TRAINER_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  // Errors come back as return codes, so the check macros can turn them into exceptions.
  TRAINER_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  TRAINER_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &topology_.rank));
  TRAINER_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &topology_.world_size));
  split_nodes();
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  topology_.hostname = host.data();
  // The desync diagnosis's own channel (ddp/desync.h): control messages only, never data.
  desync::open_control_plane();
}

// Every rank learns its node from one shared-memory split (or from kTestRanksPerNodeEnv): its
// rank there and its node's first world rank (the leader). The world is then split into the node
// communicator (colour: leader) and the cross-node one (colour: node_rank, ordered by leader),
// whose rank is the node's index; MIN and MAX of node_size say whether every node is alike.
void MpiRuntime::split_nodes() {
  MPI_Comm shared = MPI_COMM_NULL;
  TRAINER_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, topology_.rank,
                                        MPI_INFO_NULL, &shared));
  int leader = topology_.rank;
  TRAINER_MPI_CHECK(MPI_Comm_rank(shared, &topology_.local_rank));
  TRAINER_MPI_CHECK(MPI_Comm_size(shared, &topology_.local_size));
  TRAINER_MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, shared));
  MPI_Comm_free(&shared);
  MpiCommunicator::set_ranks_on_node(topology_.local_size);
  topology_.node_rank = topology_.local_rank;
  topology_.node_size = topology_.local_size;
  if (const int k = test_ranks_per_node(topology_.world_size); k > 0) {
    topology_.node_rank = topology_.rank % k;
    leader = topology_.rank - topology_.node_rank;
    // The last node runs the ranks left over when k does not divide the world (uneven nodes).
    topology_.node_size = std::min(k, topology_.world_size - leader);
  }
  std::array<int, 2> sizes = {-topology_.node_size, topology_.node_size};
  TRAINER_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes.data(), 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  topology_.uniform_nodes = -sizes[0] == sizes[1];
  node_comms_ = std::make_unique<NodeComms>();
  TRAINER_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, leader, topology_.rank, &node_comms_->node));
  TRAINER_MPI_CHECK(
      MPI_Comm_split(MPI_COMM_WORLD, topology_.node_rank, leader, &node_comms_->cross_node));
  TRAINER_MPI_CHECK(MPI_Comm_rank(node_comms_->cross_node, &topology_.node));
  TRAINER_MPI_CHECK(MPI_Comm_size(node_comms_->cross_node, &topology_.num_nodes));
}

MpiRuntime::~MpiRuntime() noexcept {
  // MPI_Finalize synchronises with the other ranks: while an exception is unwinding, a peer may
  // be stalled or gone, and finalising would hang. The code that catches it aborts the job.
  if (std::uncaught_exceptions() > 0) return;
  MpiProgress::stop();  // its thread makes MPI calls
  desync::close_control_plane();
  node_comms_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiRuntime::world(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
}

std::unique_ptr<Communicator> MpiRuntime::self(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(MPI_COMM_SELF, timeout);
}

std::unique_ptr<Communicator> MpiRuntime::node(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(node_comms_->node, timeout, /*tracked=*/true);
}

std::unique_ptr<Communicator> MpiRuntime::cross_node(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(node_comms_->cross_node, timeout, /*tracked=*/true);
}

bool MpiRuntime::start_progress_thread(std::chrono::microseconds poll) {
  if (!thread_multiple_) return false;
  MpiProgress::start(poll);
  return true;
}

void MpiRuntime::abort(int code) noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // not reached when MPI_Abort works
}

}  // namespace ddp
