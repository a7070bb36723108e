// The collectives of sharding (ZeRO, ddp/reducer.h) on the MPI communicator, in closed form: rank
// q contributes (q + 1) * k to element k of the concatenated blocks, so block r of the
// reduce-scatter SUM holds W(W+1)/2 * k there, and an in-place all-gather puts each rank's block
// in its place. The 16-bit float types go through the same user-defined sum as the all-reduce.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "common/mpi_test_env.h"
#include "ddp/errors.h"
#include "train/loss_scaler.h"

namespace TRAINER_UNITY_ID {

using ddp::ReduceOp;

std::unique_ptr<ddp::Communicator> world(double timeout_s = 30) {
  return trainer_test::runtime().world(std::chrono::duration<double>(timeout_s));
}

class ShardCollectivesReduceScatterDtype : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(ShardCollectivesReduceScatterDtype, EachRankGetsTheSumOfItsBlock) {
  auto comm = world();
  const at::ScalarType dtype = GetParam();
  const int64_t w = comm->size();
  const int64_t n = 5;                                 // elements per block
  const auto k = at::arange(1, w * n + 1, at::kLong);  // 1 .. W * n
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  if (at::isFloatingType(dtype)) ops.push_back(ReduceOp::kAvg);
  for (const ReduceOp op : ops) {
    const at::Tensor input = (k * (comm->rank() + 1)).to(dtype);
    at::Tensor output = at::full({n}, -1, dtype);
    comm->reduce_scatter(output, input, op, "test");
    const double unit = op == ReduceOp::kSum ? double(w * (w + 1) / 2) : double(w + 1) / 2;
    const at::Tensor expected = k.narrow(0, comm->rank() * n, n).to(at::kDouble) * unit;
    EXPECT_TRUE(at::equal(output.to(at::kDouble), expected))
        << "op " << ddp::to_string(op) << " dtype " << c10::toString(dtype) << ": "
        << output.to(at::kDouble) << " expected " << expected;
    // The input is left as it was.
    EXPECT_TRUE(at::equal(input, (k * (comm->rank() + 1)).to(dtype)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ShardCollectivesReduceScatterDtype,
                         ::testing::Values(at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf,
                                           at::kBFloat16));

TEST(ShardCollectives, AllGatherInPlaceFillsEveryBlockFromItsOwner) {
  auto comm = world();
  const int64_t w = comm->size();
  const int64_t n = 7;
  at::Tensor flat = at::full({w * n}, -1.0f);
  at::Tensor mine = flat.narrow(0, comm->rank() * n, n);  // this rank's block of the output
  mine.copy_(at::arange(n, at::kFloat) + 100 * comm->rank());
  comm->all_gather(flat, mine, "in place");
  for (int64_t r = 0; r < w; ++r) {
    EXPECT_TRUE(at::equal(flat.narrow(0, r * n, n), at::arange(n, at::kFloat) + 100 * r))
        << "block " << r << ": " << flat;
  }
}

TEST(ShardCollectives, ReduceScatterWithWrongSizesNamesThem) {
  auto comm = world();
  at::Tensor input = at::ones({comm->size() * 4 + 1});
  at::Tensor output = at::empty({4});
  try {
    (void)comm->reduce_scatter_async(output, input, ReduceOp::kSum, "bucket 9");
    FAIL() << "expected CommError";
  } catch (const ddp::CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bucket 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(comm->size()) + " x 4"), std::string::npos) << msg;
  }
}

// Under the same deadline as the all-reduce: a rank that does not join makes the others time out
// with a message naming the reduce-scatter, the bucket and the step.
TEST(ShardCollectives, MissingPeerTimesOutNamingTheReduceScatter) {
  auto comm = world(/*timeout_s=*/0.5);
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  comm->set_step(9);
  at::Tensor input = at::ones({comm->size() * 8});
  at::Tensor output = at::empty({8});
  if (comm->rank() == comm->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    comm->set_timeout(std::chrono::seconds(30));
    comm->reduce_scatter(output, input, ReduceOp::kSum, "late join");
  } else {
    try {
      comm->reduce_scatter(output, input, ReduceOp::kSum, "bucket 2");
      ADD_FAILURE() << "expected CommTimeout";
    } catch (const ddp::CommTimeout& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("reduce_scatter(sum) of bucket 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("step 9"), std::string::npos) << msg;
    }
    comm->set_timeout(std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  trainer_test::runtime().world(std::chrono::seconds(30))->barrier("after timeout test");
}

// fp16 with sharded gradients: an inf in one rank's block only (train.inject_nonfinite poisons
// every block, so the Trainer-level tests cannot tell) becomes every rank's verdict.
TEST(ShardCollectives, OneRanksNonFiniteBlockIsEveryRanksVerdict) {
  auto comm = world();
  train::LossScaler scaler({true, 1024.0, 2.0, 0.5, 2000}, c10::Device(c10::kCPU));
  at::Tensor block = at::ones({5});
  if (comm->rank() == 0) block[2] = std::numeric_limits<float>::infinity();
  scaler.unscale({block});
  EXPECT_EQ(scaler.found_inf().item<float>(), comm->rank() == 0 ? 1.0f : 0.0f);
  scaler.combine_verdict(*comm);
  EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f) << "rank " << comm->rank();
  // A finite step on every rank stays finite.
  at::Tensor finite = at::ones({5});
  scaler.unscale({finite});
  scaler.combine_verdict(*comm);
  EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
}

}  // namespace TRAINER_UNITY_ID
