// Launch discovery from fake environments, and device binding.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/mpi_runtime.h"
#include "launcher/cpu_binding.h"
#include "launcher/device.h"
#include "launcher/launch.h"

namespace {

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
  return {rank, world_size, local_rank, local_size, "node7"};
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

TEST(ResolveLaunch, PlainStartIsAWorldOfOne) {
  const LaunchInfo info = resolve_launch(topology(0, 1, 0, 1), fake_env({}));
  expect_launch(info, "none", 0, 1, 0, 1);
}

TEST(ResolveLaunch, WithoutLauncherVariablesMpiAloneDecides) {
  const LaunchInfo info = resolve_launch(topology(1, 2, 1, 2), fake_env({{"HOME", "/root"}}));
  expect_launch(info, "none", 1, 2, 1, 2);
}

TEST(ResolveLaunch, MpirunVariablesMatchingMpi) {
  const LaunchInfo info = resolve_launch(
      topology(3, 4, 1, 2), fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  expect_launch(info, "mpirun", 3, 4, 1, 2);
}

TEST(ResolveLaunch, MpirunVariablesDisagreeingWithMpi) {
  const std::string message = launch_error(
      topology(0, 1, 0, 1), {{"OMPI_COMM_WORLD_RANK", "1"},
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

TEST(ResolveLaunch, MpirunLocalSizeDisagreeing) {
  const std::string message = launch_error(
      topology(1, 2, 1, 2), {{"OMPI_COMM_WORLD_RANK", "1"},
                             {"OMPI_COMM_WORLD_SIZE", "2"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_THAT(message, HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=1 but MPI says ranks on this node = 2"));
  EXPECT_THAT(message, HasSubstr("OMPI_COMM_WORLD_LOCAL_RANK=0 but MPI says local rank = 1"));
  EXPECT_THAT(message, Not(HasSubstr("world size")));
}

TEST(ResolveLaunch, SrunVariablesMatchingMpi) {
  const LaunchInfo info = resolve_launch(
      topology(2, 3, 0, 1), fake_env({{"SLURM_PROCID", "2"},
                                      {"SLURM_STEP_ID", "0"},
                                      {"SLURM_NTASKS", "3"},
                                      {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "srun", 2, 3, 0, 1);
}

TEST(ResolveLaunch, SrunWithTheOlderStepIdName) {
  const LaunchInfo info = resolve_launch(
      topology(1, 2, 1, 2), fake_env({{"SLURM_PROCID", "1"},
                                      {"SLURM_STEPID", "4"},
                                      {"SLURM_NTASKS", "2"},
                                      {"SLURM_LOCALID", "1"}}));
  expect_launch(info, "srun", 1, 2, 1, 2);
}

TEST(ResolveLaunch, SrunStepTaskCountTakesPrecedenceOverTheAllocation) {
  // A 2-task step inside an 8-task allocation.
  const LaunchInfo info = resolve_launch(
      topology(0, 2, 0, 2), fake_env({{"SLURM_PROCID", "0"},
                                      {"SLURM_STEP_ID", "1"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_STEP_NUM_TASKS", "2"},
                                      {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "srun", 0, 2, 0, 2);
}

TEST(ResolveLaunch, SrunWithoutPmixSeesAWorldOfOne) {
  const std::string message = launch_error(
      topology(0, 1, 0, 1), {{"SLURM_PROCID", "2"},
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

TEST(CheckLaunchBeforeMpi, SrunWithoutPmixIsStoppedBeforeMpiInit) {
  const std::string message = before_mpi_error({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_THAT(message, HasSubstr("started by srun without --mpi=pmix (SLURM_PROCID=1)"));
  EXPECT_THAT(message, HasSubstr("Run 'srun --mpi=pmix ...'"));
  EXPECT_THAT(before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "3"}, {"SLURM_MPI_TYPE", "pmi2"},
                                {"PMI_RANK", "0"}}),
              HasSubstr("started by srun with --mpi=pmi2"));
  EXPECT_THAT(before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_STEPID", "3"}, {"SLURM_MPI_TYPE", "none"}}),
              HasSubstr("without --mpi=pmix"));
}

TEST(CheckLaunchBeforeMpi, PmixMpirunAndBatchScriptsPass) {
  EXPECT_EQ(before_mpi_error({{"SLURM_PROCID", "2"}, {"SLURM_STEP_ID", "0"}, {"PMIX_RANK", "2"},
                              {"SLURM_MPI_TYPE", "pmix"}}), "");
  EXPECT_EQ(before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"OMPI_COMM_WORLD_RANK", "1"}}), "");
  EXPECT_EQ(before_mpi_error({{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "99"}}), "");  // the batch script
  EXPECT_EQ(before_mpi_error({}), "");
}

TEST(ResolveLaunch, BatchScriptWithoutSrunIsNoLauncher) {
  // sbatch sets SLURM_PROCID for the batch script itself, but no step: the trainer was run bare.
  const LaunchInfo info = resolve_launch(
      topology(0, 1, 0, 1), fake_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"},
                                      {"SLURM_JOB_ID", "99"}}));
  expect_launch(info, "none", 0, 1, 0, 1);
}

TEST(ResolveLaunch, MpirunInsideAnSbatchAllocationIsMpirun) {
  // The SLURM_* of the batch step would disagree; Open MPI's variables win.
  const LaunchInfo info = resolve_launch(
      topology(1, 2, 1, 2), fake_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "2"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                      {"SLURM_PROCID", "0"},
                                      {"SLURM_STEP_ID", "0"},
                                      {"SLURM_NTASKS", "4"},
                                      {"SLURM_LOCALID", "0"}}));
  expect_launch(info, "mpirun", 1, 2, 1, 2);
}

TEST(ResolveLaunch, MpichVariablesMatchingMpi) {
  const LaunchInfo info = resolve_launch(
      topology(1, 2, 1, 2), fake_env({{"PMI_RANK", "1"},
                                      {"PMI_SIZE", "2"},
                                      {"MPI_LOCALRANKID", "1"},
                                      {"MPI_LOCALNRANKS", "2"}}));
  expect_launch(info, "mpiexec (MPICH)", 1, 2, 1, 2);
}

TEST(ResolveLaunch, MpichVariablesDisagreeingWithMpi) {
  const std::string message =
      launch_error(topology(0, 1, 0, 1), {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_THAT(message, HasSubstr("mpiexec (MPICH) and MPI disagree"));
  EXPECT_THAT(message, HasSubstr("PMI_SIZE=2 but MPI says world size = 1"));
  EXPECT_THAT(message, HasSubstr("PMI_RANK=1 but MPI says rank = 0"));
  EXPECT_THAT(message, HasSubstr("start it with Open MPI's mpirun"));
}

TEST(ResolveLaunch, NonIntegerVariable) {
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1),
                         {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "two"}}),
            "the launcher variable OMPI_COMM_WORLD_SIZE='two' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1),
                         {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1x"}}),
            "the launcher variable OMPI_COMM_WORLD_SIZE='1x' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1),
                         {{"SLURM_PROCID", "-1"}, {"SLURM_STEP_ID", "0"}}),
            "the launcher variable SLURM_PROCID='-1' is not a non-negative integer");
  EXPECT_EQ(launch_error(topology(0, 1, 0, 1), {{"PMI_RANK", ""}}),
            "the launcher variable PMI_RANK='' is not a non-negative integer");
}

TEST(LauncherRank, ZeroWithoutALauncher) {
  EXPECT_EQ(launcher::launcher_rank(fake_env({})), 0);
}

TEST(LauncherRank, ReadsEachLauncher) {
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"OMPI_COMM_WORLD_RANK", "3"}})), 3);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"PMI_RANK", "2"}})), 2);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"SLURM_PROCID", "5"}})), 5);
}

TEST(LauncherRank, OpenMpiWinsOverSlurm) {
  EXPECT_EQ(launcher::launcher_rank(
                fake_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_PROCID", "0"}})),
            1);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"PMI_RANK", "4"}, {"SLURM_PROCID", "0"}})), 4);
}

TEST(LauncherRank, MalformedValueIsZero) {
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"OMPI_COMM_WORLD_RANK", "x"}})), 0);
  EXPECT_EQ(launcher::launcher_rank(fake_env({{"SLURM_PROCID", "-2"}})), 0);
}

// ---- device binding ----

using launcher::bind_device;
using launcher::DeviceBinding;
using launcher::DeviceError;

std::string device_error(const std::string& requested, int local_rank, int local_size,
                         int visible, const std::string& cuda_visible) {
  try {
    bind_device(requested, local_rank, local_size, visible, cuda_visible);
  } catch (const DeviceError& e) {
    return e.what();
  }
  ADD_FAILURE() << "bind_device accepted " << requested << " with " << local_size
                << " local ranks and " << visible << " GPU(s)";
  return "";
}

TEST(BindDevice, CpuIsCpuEvenWithGpus) {
  const DeviceBinding b = bind_device("cpu", 1, 2, 4, "0,1,2,3");
  EXPECT_EQ(b.device, c10::Device(c10::kCPU));
  EXPECT_EQ(b.description, "cpu");
}

TEST(BindDevice, AutoWithoutGpusIsCpu) {
  const DeviceBinding b = bind_device("auto", 0, 1, 0, "");
  EXPECT_EQ(b.device, c10::Device(c10::kCPU));
  EXPECT_EQ(b.description, "cpu");
}

TEST(BindDevice, CudaWithoutGpusIsAnError) {
  const std::string unset = device_error("cuda", 0, 1, 0, "");
  EXPECT_THAT(unset, HasSubstr("train.device is 'cuda' but this process sees no CUDA device"));
  EXPECT_THAT(unset, HasSubstr("CUDA_VISIBLE_DEVICES unset"));
  const std::string hidden = device_error("cuda", 0, 1, 0, "-1");
  EXPECT_THAT(hidden, HasSubstr("CUDA_VISIBLE_DEVICES=-1"));
}

TEST(BindDevice, MoreLocalRanksThanGpusIsAnError) {
  const std::string message = device_error("cuda", 3, 4, 2, "0,1");
  EXPECT_THAT(message, HasSubstr("4 ranks were started on this node but only 2 GPU(s) are visible"));
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES=0,1"));
  EXPECT_THAT(message, HasSubstr("Start at most 2 rank(s) per node"));
}

TEST(BindDevice, OneGpuPerLocalRank) {
  const DeviceBinding first = bind_device("cuda", 0, 2, 2, "");
  EXPECT_EQ(first.device, c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(first.description, "cuda:0 (of 2 visible, CUDA_VISIBLE_DEVICES unset)");
  const DeviceBinding second = bind_device("cuda", 1, 2, 2, "");
  EXPECT_EQ(second.device, c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(second.description, "cuda:1 (of 2 visible, CUDA_VISIBLE_DEVICES unset)");
}

TEST(BindDevice, AutoWithEnoughGpusIsCuda) {
  const DeviceBinding b = bind_device("auto", 1, 2, 4, "2,3,4,5");
  EXPECT_EQ(b.device, c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(b.description, "cuda:1 (of 4 visible, CUDA_VISIBLE_DEVICES=2,3,4,5)");
}

}  // namespace

// CPU binding (launcher/cpu_binding.h): a rank that mpirun bound to one core of its share is
// rebound to its share; a binding as wide as the share, or train.threads set, stands.
TEST(CpuBinding, RankBoundToFewerCoresThanItsShareIsRebound) {
  const std::vector<int> node = {0, 1, 2, 3, 4, 5, 6, 7};
  // mpirun -np 1: bound to core 0 of 8.
  const auto alone = launcher::plan_cpu_binding(node, {0}, 0, 1, 0);
  EXPECT_TRUE(alone.rebound);
  EXPECT_EQ(alone.cpus, node);
  EXPECT_EQ(alone.threads, 8);
  EXPECT_EQ(alone.describe(),
            "cpus 0-7 (the launcher bound it to 0: fewer than its share of the node)");
  // mpirun -np 2: rank 1 bound to core 1; its share is the second half.
  const auto second = launcher::plan_cpu_binding(node, {1}, 1, 2, 0);
  EXPECT_TRUE(second.rebound);
  EXPECT_EQ(second.cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(second.threads, 4);
  // Three ranks on eight cores: blocks of 3, 3 and 2.
  EXPECT_EQ(launcher::plan_cpu_binding(node, {0}, 2, 3, 0).cpus, (std::vector<int>{6, 7}));
  EXPECT_EQ(launcher::plan_cpu_binding(node, {0}, 0, 3, 0).cpus, (std::vector<int>{0, 1, 2}));
}

TEST(CpuBinding, WideEnoughBindingOrExplicitThreadsStand) {
  const std::vector<int> node = {0, 1, 2, 3};
  // --bind-to none: every core stays allowed; threads = its share (2 ranks on 4 cores: 2).
  const auto unbound = launcher::plan_cpu_binding(node, node, 0, 2, 0);
  EXPECT_FALSE(unbound.rebound);
  EXPECT_EQ(unbound.cpus, node);
  EXPECT_EQ(unbound.threads, 2);
  EXPECT_EQ(unbound.describe(), "cpus 0-3");
  // srun --cpus-per-task=2: exactly the share.
  EXPECT_FALSE(launcher::plan_cpu_binding(node, {2, 3}, 1, 2, 0).rebound);
  // train.threads set: the user's binding and thread count, whatever they are.
  const auto manual = launcher::plan_cpu_binding(node, {0}, 0, 1, 3);
  EXPECT_FALSE(manual.rebound);
  EXPECT_EQ(manual.cpus, (std::vector<int>{0}));
  EXPECT_EQ(manual.threads, 3);
  // More ranks than cores, bound to both (oversubscribed): one thread each, not one per core.
  const auto crowded = launcher::plan_cpu_binding({0, 1}, {0, 1}, 2, 3, 0);
  EXPECT_FALSE(crowded.rebound);
  EXPECT_EQ(crowded.threads, 1);
  // ... and bound to one core each: stays, one thread.
  EXPECT_EQ(launcher::plan_cpu_binding({0, 1}, {1}, 2, 3, 0).threads, 1);
}

TEST(CpuBinding, CpuListsRoundTrip) {
  EXPECT_EQ(launcher::parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(launcher::format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_TRUE(launcher::parse_cpu_list("").empty());
}
