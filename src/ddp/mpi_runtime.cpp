#include "ddp/mpi_runtime.h"

#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <thread>

#include "ddp/check.h"
#include "ddp/desync.h"
#include "ddp/mpi_communicator.h"
#include "ddp/mpi_progress.h"

namespace ddp {
namespace {

// The job's ranks on this node (MpiTopology::local_size), for every communicator of the process.
std::atomic<int> g_ranks_on_node{1};

}  // namespace

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
  MPI_Comm node = MPI_COMM_NULL;
  TRAINER_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, topology_.rank,
                                        MPI_INFO_NULL, &node));
  TRAINER_MPI_CHECK(MPI_Comm_rank(node, &topology_.local_rank));
  TRAINER_MPI_CHECK(MPI_Comm_size(node, &topology_.local_size));
  MPI_Comm_free(&node);
  g_ranks_on_node = topology_.local_size;
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  topology_.hostname = host.data();
  // The desync diagnosis's own channel (ddp/desync.h): control messages only, never data.
  desync::open_control_plane();
}

MpiRuntime::~MpiRuntime() noexcept {
  // MPI_Finalize synchronises with the other ranks: while an exception is unwinding, a peer may
  // be stalled or gone, and finalising would hang. The code that catches it aborts the job.
  if (std::uncaught_exceptions() > 0) return;
  MpiProgress::stop();  // its thread makes MPI calls
  desync::close_control_plane();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool MpiRuntime::node_oversubscribed() {
  return g_ranks_on_node.load() > static_cast<int>(std::thread::hardware_concurrency());
}

std::unique_ptr<Communicator> MpiRuntime::world(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
}

std::unique_ptr<Communicator> MpiRuntime::self(std::chrono::duration<double> timeout) const {
  return std::make_unique<MpiCommunicator>(MPI_COMM_SELF, timeout);
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
