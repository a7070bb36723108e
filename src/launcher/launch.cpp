#include "launcher/launch.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <vector>

namespace launcher {
namespace {

struct Expected {
  std::string launcher;
  const char* rank = nullptr;
  const char* size = nullptr;
  const char* local_rank = nullptr;
  const char* local_size = nullptr;
  std::string hint;  // what usually causes a mismatch with this launcher
};

std::optional<int> read_int(const EnvLookup& env, const char* name) {
  if (name == nullptr) return std::nullopt;
  const auto value = env(name);
  if (!value) return std::nullopt;
  int v = 0;
  auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), v);
  if (ec != std::errc() || end != value->data() + value->size() || v < 0) {
    throw LaunchError(
        fmt::format("the launcher variable {}='{}' is not a non-negative integer", name, *value));
  }
  return v;
}

std::optional<Expected> detect(const EnvLookup& env) {
  // Order matters: mpirun inside a SLURM allocation also inherits SLURM_* of the batch step.
  if (env("OMPI_COMM_WORLD_RANK")) {
    return Expected{
        "mpirun",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "the trainer was built against a different MPI than the mpirun that started it"};
  }
  if (env("PMI_RANK")) {
    return Expected{"mpiexec (MPICH)",
                    "PMI_RANK",
                    "PMI_SIZE",
                    "MPI_LOCALRANKID",
                    "MPI_LOCALNRANKS",
                    "the trainer is built against Open MPI; start it with Open MPI's mpirun"};
  }
  if (env("SLURM_PROCID") && (env("SLURM_STEP_ID") || env("SLURM_STEPID"))) {
    return Expected{"srun",
                    "SLURM_PROCID",
                    env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS",
                    "SLURM_LOCALID",
                    nullptr,
                    "srun must connect the tasks through PMIx: run 'srun --mpi=pmix ...' (or set "
                    "MpiDefault=pmix in slurm.conf)"};
  }
  return std::nullopt;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

int launcher_rank(const EnvLookup& env) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    try {
      if (auto r = read_int(env, name)) return *r;
    } catch (const LaunchError&) {
      return 0;
    }
  }
  return 0;
}

void check_launch_before_mpi(const EnvLookup& env) {
  const bool srun_task = env("SLURM_STEP_ID") || env("SLURM_STEPID");
  if (!srun_task || env("OMPI_COMM_WORLD_RANK") || env("PMIX_RANK")) return;
  // Under mpirun inside an allocation, OMPI_COMM_WORLD_RANK is set; under srun --mpi=pmix,
  // PMIX_RANK is. Anything else would end in MPI_Init ("OMPI was not built with SLURM's PMI
  // support"), which sends users to rebuild Open MPI instead of adding one flag.
  const auto type = env("SLURM_MPI_TYPE");
  throw LaunchError(fmt::format(
      "started by srun {} (SLURM_PROCID={}), so MPI cannot join the tasks into one job: this "
      "Open MPI connects srun tasks through PMIx only.\nRun 'srun --mpi=pmix ...' (or set "
      "MpiDefault=pmix in slurm.conf), or start the ranks with mpirun inside the allocation.",
      type && *type != "none" ? fmt::format("with --mpi={}", *type)
                              : std::string("without --mpi=pmix"),
      env("SLURM_PROCID").value_or("?")));
}

LaunchInfo resolve_launch(const ddp::MpiTopology& mpi, const EnvLookup& env) {
  LaunchInfo info{"none", mpi.rank, mpi.world_size, mpi.local_rank, mpi.local_size, mpi.hostname};
  const auto expected = detect(env);
  if (!expected) {
    // No launcher we know: MPI alone decides (a plain start is a world of one).
    return info;
  }
  info.launcher = expected->launcher;
  struct Check {
    const char* var;
    int mpi_value;
    const char* what;
  };
  const std::vector<Check> checks = {
      {expected->size, mpi.world_size, "world size"},
      {expected->rank, mpi.rank, "rank"},
      {expected->local_size, mpi.local_size, "ranks on this node"},
      {expected->local_rank, mpi.local_rank, "local rank"},
  };
  std::vector<std::string> mismatches;
  for (const auto& c : checks) {
    const auto v = read_int(env, c.var);
    if (v && *v != c.mpi_value) {
      mismatches.push_back(
          fmt::format("{}={} but MPI says {} = {}", c.var, *v, c.what, c.mpi_value));
    }
  }
  if (!mismatches.empty()) {
    std::string list;
    for (const auto& m : mismatches) list += "\n  " + m;
    throw LaunchError(
        fmt::format("{} and MPI disagree about this process (host {}):{}\nLikely cause: {}.",
                    expected->launcher, mpi.hostname, list, expected->hint));
  }
  return info;
}

}  // namespace launcher
