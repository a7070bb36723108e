// The desync diagnosis (ddp/desync.h) over real MPI: a timeout's message names the rank that is
// missing from the collective, whether that rank answers the exchange or not.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/mpi_test_env.h"
#include "ddp/errors.h"

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

}  // namespace TRAINER_UNITY_ID
