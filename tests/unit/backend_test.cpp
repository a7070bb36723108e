// Backend choice: NCCL for CUDA tensors, MPI for CPU ones; impossible choices name ddp.backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "ddp/backend.h"
#include "ddp/communicator.h"
#include "ddp/options.h"

namespace TRAINER_UNITY_ID {

using ddp::resolve_backend;
using ::testing::HasSubstr;
const c10::Device kCpu(c10::kCPU);
const c10::Device kGpu(c10::kCUDA, 0);

TEST(Backend, AutoPicksNcclForCudaAndMpiForCpu) {
  EXPECT_EQ(resolve_backend("auto", kGpu, true), "nccl");
  EXPECT_EQ(resolve_backend("auto", kCpu, true), "mpi");
  EXPECT_EQ(resolve_backend("auto", kGpu, false), "mpi");
  EXPECT_EQ(resolve_backend("mpi", kGpu, true), "mpi");
  EXPECT_EQ(resolve_backend("nccl", kGpu, true), "nccl");
}

// ddp.mpi_progress: auto starts the progress thread only where prefetched gathers need it.
TEST(Backend, MpiProgressAutoIsTheThreadUnderShardedParametersOnly) {
  using ddp::MpiProgressMode;
  using ddp::ShardMode;
  EXPECT_TRUE(ddp::mpi_progress_thread(MpiProgressMode::kAuto, ShardMode::kParameters, 2));
  EXPECT_FALSE(ddp::mpi_progress_thread(MpiProgressMode::kAuto, ShardMode::kParameters, 1));
  for (const ShardMode m : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients}) {
    EXPECT_FALSE(ddp::mpi_progress_thread(MpiProgressMode::kAuto, m, 4));
  }
  EXPECT_TRUE(ddp::mpi_progress_thread(MpiProgressMode::kThread, ShardMode::kNone, 1));
  EXPECT_FALSE(ddp::mpi_progress_thread(MpiProgressMode::kCaller, ShardMode::kParameters, 4));
}

TEST(Backend, NcclOnCpuIsAnErrorNamingTheKey) {
  try {
    resolve_backend("nccl", kCpu, true);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("ddp.backend: 'nccl'"));
    EXPECT_THAT(e.what(), HasSubstr("cpu"));
  }
  EXPECT_THROW(resolve_backend("nccl", kGpu, false), std::invalid_argument);
}

}  // namespace TRAINER_UNITY_ID

namespace TRAINER_UNITY_ID {

// Timeout messages say where in the run they happened; before step 1 there is no step to name.
TEST(BackendCommunicator, MessagesNameTheStepOrStartUp) {
  EXPECT_EQ(ddp::Communicator::when(7), "at step 7");
  EXPECT_EQ(ddp::Communicator::when(-1), "during start-up (before step 1)");
}

}  // namespace TRAINER_UNITY_ID
