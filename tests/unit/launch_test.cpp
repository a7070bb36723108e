// Launch discovery (launcher/launch.h) from fake environments: mpirun, srun, MPICH, none.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/mpi_runtime.h"
#include "launcher/launch.h"

namespace TRAINER_UNITY_ID {

using launcher::LaunchError;
using launcher::LaunchInfo;
using launcher::resolve_launch;
using ::testing::HasSubstr;
using ::testing::Not;

launcher::EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

ddp::MpiTopology topology(int rank, int world_size, int local_rank, int local_size) {
  return {.rank = rank,
          .world_size = world_size,
          .local_rank = local_rank,
          .local_size = local_size,
          .hostname = "node7"};
}

// The LaunchError message resolve_launch throws; "" and a failure when it throws none.
std::string launch_error(const ddp::MpiTopology& mpi, std::map<std::string, std::string> vars) {
  try {
    resolve_launch(mpi, fake_env(std::move(vars)));
  } catch (const LaunchError& e) {
    return e.what();
  }
  ADD_FAILURE() << "resolve_launch accepted the environment";
  return "";
}

void expect_launch(const LaunchInfo& info, const std::string& launcher, int rank, int world_size,
                   int local_rank, int local_size) {
  EXPECT_EQ(info.launcher, launcher);
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, world_size);
  EXPECT_EQ(info.local_rank, local_rank);
  EXPECT_EQ(info.local_size, local_size);
  EXPECT_EQ(info.hostname, "node7");
}

TEST(LaunchResolve, PlainStartIsAWorldOfOne) {
  const LaunchInfo info = resolve_launch(topology(0, 1, 0, 1), fake_env({}));
  expect_launch(info, "none", 0, 1, 0, 1);
}

TEST(LaunchResolve, WithoutLauncherVariablesMpiAloneDecides) {
  const LaunchInfo info = resolve_launch(topology(1, 2, 1, 2), fake_env({{"HOME", "/root"}}));
  expect_launch(info, "none", 1, 2, 1, 2);
}

TEST(LaunchResolve, MpirunVariablesMatchingMpi) {
  const LaunchInfo info =
      resolve_launch(topology(3, 4, 1, 2), fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  expect_launch(info, "mpirun", 3, 4, 1, 2);
}

TEST(LaunchResolve, MpirunVariablesDisagreeingWithMpi) {
  const std::string message =
      launch_error(topology(0, 1, 0, 1), {{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_THAT(message, HasSubstr("mpirun and MPI disagree about this process (host node7)"));
  EXPECT_THAT(message, HasSubstr("\n  OMPI_COMM_WORLD_SIZE=2 but MPI says world size = 1"));
  EXPECT_THAT(message, HasSubstr("\n  OMPI_COMM_WORLD_RANK=1 but MPI says rank = 0"));
  // Variables that agree are not listed.
  EXPECT_THAT(message, Not(HasSubstr("OMPI_COMM_WORLD_LOCAL_RANK")));
  EXPECT_THAT(message, Not(HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE")));
  EXPECT_THAT(message, HasSubstr("Likely cause: the trainer was built against a different MPI"));
}

TEST(LaunchResolve, MpirunLocalSizeDisagreeing) {
  const std::string message =
      launch_error(topology(1, 2, 1, 2), {{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_THAT(message,
              HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=1 but MPI says ranks on this node = 2"));
  EXPECT_THAT(message, HasSubstr("OMPI_COMM_WORLD_LOCAL_RANK=0 but MPI says local rank = 1"));
  EXPECT_THAT(message, Not(HasSubstr("world size")));
}

TEST(LaunchResolve, SrunVariablesMatchingMpi) {
  const LaunchInfo info = resolve_launch(topology(2, 3, 0, 1), fake_env({{"SLURM_PROCID", "2"},
                                                                         {"SLURM_STEP_ID", "0"},
                                                                         {"SLURM_NTASKS", "3"},
                                                                         {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "srun", 2, 3, 0, 1);
}

TEST(LaunchResolve, SrunWithTheOlderStepIdName) {
  const LaunchInfo info = resolve_launch(topology(1, 2, 1, 2), fake_env({{"SLURM_PROCID", "1"},
                                                                         {"SLURM_STEPID", "4"},
                                                                         {"SLURM_NTASKS", "2"},
                                                                         {"SLURM_LOCALID", "1"}}));
  expect_launch(info, "srun", 1, 2, 1, 2);
}

TEST(LaunchResolve, SrunStepTaskCountTakesPrecedenceOverTheAllocation) {
  // A 2-task step inside an 8-task allocation.
  const LaunchInfo info =
      resolve_launch(topology(0, 2, 0, 2), fake_env({{"SLURM_PROCID", "0"},
                                                     {"SLURM_STEP_ID", "1"},
                                                     {"SLURM_NTASKS", "8"},
                                                     {"SLURM_STEP_NUM_TASKS", "2"},
                                                     {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "srun", 0, 2, 0, 2);
}

TEST(LaunchResolve, SrunWithoutPmixSeesAWorldOfOne) {
  const std::string message = launch_error(topology(0, 1, 0, 1), {{"SLURM_PROCID", "2"},
                                                                  {"SLURM_STEP_ID", "0"},
                                                                  {"SLURM_NTASKS", "3"},
                                                                  {"SLURM_LOCALID", "2"}});
  EXPECT_THAT(message, HasSubstr("srun and MPI disagree"));
  EXPECT_THAT(message, HasSubstr("SLURM_NTASKS=3 but MPI says world size = 1"));
  EXPECT_THAT(message, HasSubstr("SLURM_PROCID=2 but MPI says rank = 0"));
  EXPECT_THAT(message, HasSubstr("SLURM_LOCALID=2 but MPI says local rank = 0"));
  EXPECT_THAT(message, HasSubstr("srun --mpi=pmix"));
}

// What a task of a real srun step sees (checked on the local SLURM of the `slurm` tests): without
// --mpi=pmix there is no PMIX_RANK, and MPI_Init would abort with Open MPI's own advice to
// rebuild it, so the trainer stops first.
std::string before_mpi_error(std::map<std::string, std::string> vars) {
  try {
    launcher::check_launch_before_mpi(fake_env(std::move(vars)));
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchBeforeMpi, SrunWithoutPmixIsStoppedBeforeMpiInit) {
  const std::string message = before_mpi_error({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_THAT(message, HasSubstr("started by srun without --mpi=pmix (SLURM_PROCID=1)"));
  EXPECT_THAT(message, HasSubstr("Run 'srun --mpi=pmix ...'"));
  EXPECT_THAT(before_mpi_error({{"SLURM_PROCID", "0"},
                                {"SLURM_STEP_ID", "3"},
                                {"SLURM_MPI_TYPE", "pmi2"},
                                {"PMI_RANK", "0"}}),
              HasSubstr("started by srun with --mpi=pmi2"));
  EXPECT_THAT(
      before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_STEPID", "3"}, {"SLURM_MPI_TYPE", "none"}}),
      HasSubstr("without --mpi=pmix"));
}

TEST(LaunchBeforeMpi, PmixMpirunAndBatchScriptsPass) {
  EXPECT_EQ(before_mpi_error({{"SLURM_PROCID", "2"},
                              {"SLURM_STEP_ID", "0"},
                              {"PMIX_RANK", "2"},
                              {"SLURM_MPI_TYPE", "pmix"}}),
            "");
  EXPECT_EQ(before_mpi_error(
                {{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"OMPI_COMM_WORLD_RANK", "1"}}),
            "");
  EXPECT_EQ(before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "99"}}),
            "");  // the batch script
  EXPECT_EQ(before_mpi_error({}), "");
}

TEST(LaunchResolve, BatchScriptWithoutSrunIsNoLauncher) {
  // sbatch sets SLURM_PROCID for the batch script itself, but no step: the trainer was run bare.
  const LaunchInfo info = resolve_launch(
      topology(0, 1, 0, 1),
      fake_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "99"}}));
  expect_launch(info, "none", 0, 1, 0, 1);
}

TEST(LaunchResolve, MpirunInsideAnSbatchAllocationIsMpirun) {
  // The SLURM_* of the batch step would disagree; Open MPI's variables win.
  const LaunchInfo info =
      resolve_launch(topology(1, 2, 1, 2), fake_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                                     {"OMPI_COMM_WORLD_SIZE", "2"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                     {"SLURM_PROCID", "0"},
                                                     {"SLURM_STEP_ID", "0"},
                                                     {"SLURM_NTASKS", "4"},
                                                     {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "mpirun", 1, 2, 1, 2);
}

TEST(LaunchResolve, MpichVariablesMatchingMpi) {
  const LaunchInfo info =
      resolve_launch(topology(1, 2, 1, 2), fake_env({{"PMI_RANK", "1"},
                                                     {"PMI_SIZE", "2"},
                                                     {"MPI_LOCALRANKID", "1"},
                                                     {"MPI_LOCALNRANKS", "2"}}));
  expect_launch(info, "mpiexec (MPICH)", 1, 2, 1, 2);
}

TEST(LaunchResolve, MpichVariablesDisagreeingWithMpi) {
  const std::string message =
      launch_error(topology(0, 1, 0, 1), {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_THAT(message, HasSubstr("mpiexec (MPICH) and MPI disagree"));
  EXPECT_THAT(message, HasSubstr("PMI_SIZE=2 but MPI says world size = 1"));
  EXPECT_THAT(message, HasSubstr("PMI_RANK=1 but MPI says rank = 0"));
  EXPECT_THAT(message, HasSubstr("start it with Open MPI's mpirun"));
}

TEST(LaunchResolve, NonIntegerVariable) {
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1),
                         {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "two"}}),
            "the launcher variable OMPI_COMM_WORLD_SIZE='two' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1),
                         {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1x"}}),
            "the launcher variable OMPI_COMM_WORLD_SIZE='1x' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1), {{"SLURM_PROCID", "-1"}, {"SLURM_STEP_ID", "0"}}),
            "the launcher variable SLURM_PROCID='-1' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1), {{"PMI_RANK", ""}}),
            "the launcher variable PMI_RANK='' is not a non-negative integer");
}

TEST(LaunchRank, ZeroWithoutALauncher) { EXPECT_EQ(launcher::launcher_rank(fake_env({})), 0); }

TEST(LaunchRank, ReadsEachLauncher) {
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"OMPI_COMM_WORLD_RANK", "3"}})), 3);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"PMI_RANK", "2"}})), 2);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"SLURM_PROCID", "5"}})), 5);
}

TEST(LaunchRank, OpenMpiWinsOverSlurm) {
  EXPECT_EQ(
      launcher::launcher_rank(fake_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_PROCID", "0"}})), 1);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"PMI_RANK", "4"}, {"SLURM_PROCID", "0"}})), 4);
}

TEST(LaunchRank, MalformedValueIsZero) {
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"OMPI_COMM_WORLD_RANK", "x"}})), 0);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"SLURM_PROCID", "-2"}})), 0);
}

}  // namespace TRAINER_UNITY_ID
