// The desync diagnosis (ddp/desync.h) over real MPI: a timeout's message names the rank that is
// missing from the collective, whether that rank answers the exchange or not; and the failure file
// it feeds (launcher/failure_file.h).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <thread>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "ddp/errors.h"
#include "ddp/gather.h"
#include "launcher/failure_file.h"

namespace TRAINER_UNITY_ID {

using ddp::ReduceOp;

std::unique_ptr<ddp::Communicator> world(double timeout_s) {
  return trainer_test::runtime().world(std::chrono::duration<double>(timeout_s));
}

std::string timeout_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::CommTimeout& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CommTimeout";
  return {};
}

// The last rank skips step 58's all-reduce of bucket 3 on the data communicator and waits in the
// next status vote on the control communicator instead. Every rank times out; the exchange finds
// each side where it is: the others name the last rank as missing from bucket 3, and it names
// them as missing from its vote.
TEST(DesyncMpi, TimeoutNamesTheRankThatSkippedTheCollective) {
  auto control = world(30);
  auto data = world(30);
  const int w = data->size();
  if (w < 2) GTEST_SKIP() << "needs 2 ranks";
  const int skipper = w - 1;
  // Step 57 completes everywhere.
  control->set_step(57);
  data->set_step(57);
  at::Tensor grad = at::ones({8});
  data->all_reduce(grad, ReduceOp::kSum, "bucket 2");
  at::Tensor vote = at::zeros({1});
  control->all_reduce(vote, ReduceOp::kMax, "status vote");

  control->set_step(58);
  data->set_step(58);
  control->set_timeout(std::chrono::duration<double>(1.0));
  data->set_timeout(std::chrono::duration<double>(1.0));
  const int rank = data->rank();
  at::Tensor late_grad = at::ones({8});
  at::Tensor late_vote = at::zeros({1});
  if (rank == skipper) {
    const std::string msg =
        timeout_message([&] { control->all_reduce(late_vote, ReduceOp::kMax, "status vote"); });
    EXPECT_NE(msg.find("status vote"), std::string::npos) << msg;
    for (int r = 0; r < skipper; ++r) {
      EXPECT_NE(msg.find(fmt::format(
                    "rank {} did not reach the all_reduce(max) of status vote at step 58 (last "
                    "completed: step 57, all_reduce(max) of status vote; it waits in the "
                    "all_reduce(sum) of bucket 3 at step 58)",
                    r)),
                std::string::npos)
          << msg;
    }
  } else {
    const std::string msg =
        timeout_message([&] { data->all_reduce(late_grad, ReduceOp::kSum, "bucket 3"); });
    EXPECT_NE(msg.find("ddp.timeout_s"), std::string::npos) << msg;
    EXPECT_NE(
        msg.find(fmt::format("answers from rank(s) {} of {}", w == 2 ? "0, 1" : "0, 1, 2", w)),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find(fmt::format(
                  "rank {} did not reach the all_reduce(sum) of bucket 3 at step 58 (last "
                  "completed: step 57, all_reduce(sum) of bucket 2; it waits in the "
                  "all_reduce(max) of status vote at step 58)",
                  skipper)),
              std::string::npos)
        << msg;
    for (int r = 0; r < skipper; ++r) {
      EXPECT_EQ(msg.find(fmt::format("rank {} did not", r)), std::string::npos) << msg;
    }
  }
  // Each side joins what the other waits in, so the abandoned requests complete.
  control->set_timeout(std::chrono::seconds(30));
  data->set_timeout(std::chrono::seconds(30));
  if (rank == skipper) {
    data->all_reduce(late_grad, ReduceOp::kSum, "bucket 3 (late)");
  } else {
    control->all_reduce(late_vote, ReduceOp::kMax, "status vote (late)");
  }
  world(30)->barrier("after desync test");
}

// The last rank is lost: it never joins bucket 5 and never answers the exchange. Rank 0, which
// the others defer to, reaches bucket 5 a second after rank 1 (on a busy machine the lowest rank
// is often the slowest: it also logs), so rank 1's timeout, exchange and its 0.5 s of "lowest
// speaks first" all end before rank 0's exchange does; under srun rank 1's MPI_Abort would then
// kill rank 0 before it could write. So each rank, the moment it would abort, must find
// checkpoint.dir/failure.json naming the lost rank and its host: written by itself if need be.
TEST(DesyncMpi, TheFirstRankToAbortHasWrittenTheFailureFile) {
  auto control = world(30);
  auto data = world(30);
  const int w = data->size();
  if (w < 3) GTEST_SKIP() << "needs 3 ranks: two that answer, one lost";
  const int rank = data->rank();
  const int lost = w - 1;
  std::optional<test::TempDir> tmp;
  if (rank == 0) tmp.emplace();
  const std::string dir = ddp::all_gather_strings(*control, tmp ? tmp->path() : "")[0];
  launcher::arm_failure_file(*control, rank, fmt::format("host{}", rank), dir);
  const std::string path = dir + "/failure.json";

  data->set_step(41);
  at::Tensor grad = at::ones({8});
  data->all_reduce(grad, ReduceOp::kSum, "bucket 4");
  data->set_step(42);
  // A timeout of 3 s: the exchange waits 1.5 s for answers; rank 0's (1 s late) lands in it.
  data->set_timeout(std::chrono::duration<double>(3.0));
  if (rank == lost) {
    control->barrier("the others have timed out");
  } else {
    if (rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    try {
      data->all_reduce(grad, ReduceOp::kSum, "bucket 5");
      ADD_FAILURE() << "expected CommTimeout";
    } catch (const ddp::CommTimeout& e) {
      EXPECT_EQ(launcher::write_failure_file(e, 3), path);
      std::ifstream in(path);
      EXPECT_TRUE(in) << "rank " << rank << " would abort the job with no " << path;
      if (in) {  // no ASSERT here: every rank must reach the barrier below
        const auto record = nlohmann::json::parse(in);
        EXPECT_EQ(record["lost_ranks"], nlohmann::json::array({lost})) << record.dump();
        EXPECT_EQ(record["lost_hosts"], nlohmann::json::array({fmt::format("host{}", lost)}));
        EXPECT_EQ(record["step"], 42);
        EXPECT_EQ(record["exit_code"], 3);
      }
    }
    control->barrier("the others have timed out");
  }
  // The lost rank joins bucket 5 late, so the requests the others gave up on complete.
  data->set_timeout(std::chrono::seconds(30));
  if (rank == lost) data->all_reduce(grad, ReduceOp::kSum, "bucket 5 (late)");
  world(30)->barrier("after the failure file test");
  launcher::arm_failure_file(*control, rank, "", "");  // disarmed: no checkpoint.dir
}

// A rank killed while writing its failure.json.R.tmp (another rank's abort came first) leaves it
// behind; the next run removes it as it arms, and leaves the rest of checkpoint.dir alone.
TEST(DesyncMpi, ArmingTheFailureFileRemovesWhatAKilledWriterLeft) {
  auto control = world(30);
  std::optional<test::TempDir> tmp;
  if (control->rank() == 0) {
    tmp.emplace();
    for (const char* name : {"failure.json.3.tmp", "failure.json", "step_000010.safetensors"}) {
      std::ofstream(tmp->file(name)) << "{}\n";
    }
  }
  const std::string dir = ddp::all_gather_strings(*control, tmp ? tmp->path() : "")[0];
  launcher::arm_failure_file(*control, control->rank(), "host", dir);
  if (tmp) {
    EXPECT_FALSE(std::ifstream(tmp->file("failure.json.3.tmp")).good());
    EXPECT_TRUE(std::ifstream(tmp->file("failure.json")).good());
    EXPECT_TRUE(std::ifstream(tmp->file("step_000010.safetensors")).good());
  }
  launcher::arm_failure_file(*control, control->rank(), "", "");
  control->barrier("after the failure file test");
}

}  // namespace TRAINER_UNITY_ID
