// Launch discovery: who started this process (mpirun, srun, MPICH's mpiexec, nothing) and where
// it stands in the job, cross-checked against what MPI itself says. A disagreement (e.g. srun
// without --mpi=pmix, so every task is a world of one) is a LaunchError that says what disagreed
// and how to fix it.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "ddp/mpi_runtime.h"

namespace launcher {

struct LaunchInfo {
  std::string launcher;  // "mpirun", "srun", "mpiexec (MPICH)", "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string hostname;
};

class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads one environment variable; the indirection lets tests fake an environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

LaunchInfo resolve_launch(const ddp::MpiTopology& mpi, const EnvLookup& env);

// Launch mistakes that MPI_Init itself would turn into an abort with a misleading message, found
// from the environment before MPI starts: a task of an srun step that srun did not give PMIx
// (no --mpi=pmix), which this Open MPI cannot join into one job. Throws LaunchError.
void check_launch_before_mpi(const EnvLookup& env);

// The world rank the launcher gave this process, before MPI is up (for deciding who prints
// command-line errors). 0 when no launcher variable is set.
int launcher_rank(const EnvLookup& env);

}  // namespace launcher
