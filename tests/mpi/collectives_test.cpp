// MpiCommunicator collectives with closed-form results: with ranks r = 0..W-1 contributing r + 1,
// SUM = W(W+1)/2, MAX = W, MIN = 1, AVG = (W+1)/2.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "common/mpi_test_env.h"
#include "ddp/errors.h"
#include "ddp/gather.h"

namespace TRAINER_UNITY_ID {

using ddp::ReduceOp;

std::unique_ptr<ddp::Communicator> world(double timeout_s = 30) {
  return trainer_test::runtime().world(std::chrono::duration<double>(timeout_s));
}

class CollectivesAllReduceDtype : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(CollectivesAllReduceDtype, SumMaxMinAvgInClosedForm) {
  auto comm = world();
  const at::ScalarType dtype = GetParam();
  const int64_t w = comm->size();
  const int64_t mine = comm->rank() + 1;
  const bool floating = at::isFloatingType(dtype);
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  if (floating) ops.push_back(ReduceOp::kAvg);
  for (const ReduceOp op : ops) {
    // 1000 elements, element i holds (rank + 1) * (i % 7 + 1): results scale the same way.
    const auto scale = at::arange(1000, at::kLong).remainder(7).add(1);
    at::Tensor t = (scale * mine).to(dtype);
    comm->all_reduce(t, op, "test");
    double expected_unit = 0;
    switch (op) {
      case ReduceOp::kSum: expected_unit = double(w * (w + 1) / 2); break;
      case ReduceOp::kMax: expected_unit = double(w); break;
      case ReduceOp::kMin: expected_unit = 1; break;
      case ReduceOp::kAvg: expected_unit = double(w + 1) / 2; break;
    }
    const at::Tensor expected = scale.to(at::kDouble) * expected_unit;
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(t.to(at::kDouble), expected))
        << "op " << ddp::to_string(op) << " dtype " << c10::toString(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CollectivesAllReduceDtype,
                         ::testing::Values(at::kFloat, at::kDouble, at::kInt, at::kLong, at::kHalf,
                                           at::kBFloat16, at::kByte));

TEST(Collectives, AllReduceOfRanksIsTriangularNumber) {
  auto comm = world();
  const int w = comm->size();
  at::Tensor t = at::full({3}, comm->rank(), at::kLong);
  comm->all_reduce(t, ReduceOp::kSum);
  EXPECT_EQ(t[0].item<int64_t>(), int64_t(w) * (w - 1) / 2);
}

TEST(Collectives, NonContiguousTensorIsReducedInPlace) {
  auto comm = world();
  at::Tensor base = at::zeros({4, 6}, at::kFloat);
  at::Tensor view = base.t();  // non-contiguous
  view.fill_(comm->rank() + 1);
  comm->all_reduce(view, ReduceOp::kSum);
  const float expected = float(comm->size() * (comm->size() + 1) / 2);
  EXPECT_TRUE(at::equal(base, at::full({4, 6}, expected, at::kFloat)));
}

TEST(Collectives, AsyncOperationsCompleteInAnyWaitOrder) {
  auto comm = world();
  std::vector<at::Tensor> tensors;
  std::vector<ddp::WorkPtr> works;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(at::full({1 << 12}, double(comm->rank() + i), at::kDouble));
    works.push_back(comm->all_reduce_async(tensors.back(), ReduceOp::kSum, "async"));
  }
  for (int i = 7; i >= 0; --i) works[i]->wait();
  const int w = comm->size();
  for (int i = 0; i < 8; ++i) {
    EXPECT_DOUBLE_EQ(tensors[i][0].item<double>(), double(w) * (w - 1) / 2 + double(w) * i);
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  auto comm = world();
  for (int root = 0; root < comm->size(); ++root) {
    at::Tensor t = at::full({5}, comm->rank() == root ? 100 + root : -1, at::kInt);
    comm->broadcast(t, root);
    EXPECT_TRUE(at::equal(t, at::full({5}, 100 + root, at::kInt))) << "root " << root;
  }
}

TEST(Collectives, AllGatherOrdersBlocksByRank) {
  auto comm = world();
  const int w = comm->size();
  at::Tensor mine = at::full({2, 3}, comm->rank(), at::kFloat);
  at::Tensor all = at::empty({2 * w, 3}, at::kFloat);
  comm->all_gather(all, mine);
  for (int r = 0; r < w; ++r) {
    EXPECT_TRUE(at::equal(all.narrow(0, 2 * r, 2), at::full({2, 3}, r, at::kFloat)));
  }
  const auto names = ddp::all_gather_strings(*comm, "rank-" + std::to_string(comm->rank()));
  ASSERT_EQ(names.size(), size_t(w));
  for (int r = 0; r < w; ++r) EXPECT_EQ(names[r], "rank-" + std::to_string(r));
}

TEST(Collectives, AllGatherWithWrongOutputSizeNamesTheShapes) {
  auto comm = world();
  at::Tensor mine = at::zeros({4}, at::kFloat);
  at::Tensor out = at::zeros({4 * comm->size() + 1}, at::kFloat);
  EXPECT_THROW(
      {
        try {
          auto work = comm->all_gather_async(out, mine, "misfit");
        } catch (const ddp::CommError& e) {
          EXPECT_NE(std::string(e.what()).find("misfit"), std::string::npos);
          throw;
        }
      },
      ddp::CommError);
}

TEST(Collectives, AvgOnIntegersIsRejected) {
  auto comm = world();
  at::Tensor t = at::zeros({2}, at::kInt);
  EXPECT_THROW(comm->all_reduce(t, ReduceOp::kAvg), ddp::CommError);
}

// A rank that does not join a collective makes the others time out with a message naming the
// operation and step; it does not hang them. (The late rank joins afterwards, so MPI stays sane.)
TEST(Collectives, MissingPeerTimesOutWithMessage) {
  auto comm = world(/*timeout_s=*/0.5);
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  comm->set_step(7);
  at::Tensor t = at::ones({16}, at::kFloat);
  if (comm->rank() == comm->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    comm->set_timeout(std::chrono::seconds(30));
    comm->all_reduce(t, ReduceOp::kSum, "late join");
  } else {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->all_reduce(t, ReduceOp::kSum, "bucket 4");
      ADD_FAILURE() << "expected CommTimeout";
    } catch (const ddp::CommTimeout& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("bucket 4"), std::string::npos) << msg;
      EXPECT_NE(msg.find("step 7"), std::string::npos) << msg;
      EXPECT_NE(msg.find("ddp.timeout_s"), std::string::npos) << msg;
      // The late rank sleeps through the desync exchange (ddp/desync.h): named as not answering.
      EXPECT_NE(msg.find(fmt::format("rank {} did not reach the all_reduce(sum) of bucket 4 at "
                                     "step 7, or is stuck in it: no answer within 0.25 s",
                                     comm->size() - 1)),
                std::string::npos)
          << msg;
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1400));
    }
    // Let the pending request finish before `t` goes away.
    comm->set_timeout(std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  trainer_test::runtime().world(std::chrono::seconds(30))->barrier("after timeout test");
}

// The hybrid-sharding communicators (MpiRuntime::node, cross_node). Ranks fill nodes in order
// (one real node, or kTestRanksPerNodeEnv's K consecutive ranks: the mpi_tests_nodes_np4 test runs
// this suite as 2 nodes x 2), so world rank = node * K + node rank, and sums are closed-form.
TEST(CollectivesNodes, TopologyMatchesTheCommunicators) {
  const auto& t = trainer_test::runtime().topology();
  auto node = trainer_test::runtime().node(std::chrono::seconds(30));
  auto cross = trainer_test::runtime().cross_node(std::chrono::seconds(30));
  ASSERT_TRUE(t.uniform_nodes);
  EXPECT_EQ(t.num_nodes * t.node_size, t.world_size);
  EXPECT_EQ(node->size(), t.node_size);
  EXPECT_EQ(node->rank(), t.node_rank);
  EXPECT_EQ(cross->size(), t.num_nodes);
  EXPECT_EQ(cross->rank(), t.node);
  EXPECT_EQ(t.rank, t.node * t.node_size + t.node_rank);
  if (const char* k = std::getenv(ddp::kTestRanksPerNodeEnv)) {
    EXPECT_EQ(t.node_size, std::atoi(k)) << "the test override of the node size is not honoured";
  }
}

TEST(CollectivesNodes, NodeThenCrossNodeSumIsTheWorldSum) {
  const auto& t = trainer_test::runtime().topology();
  auto node = trainer_test::runtime().node(std::chrono::seconds(30));
  auto cross = trainer_test::runtime().cross_node(std::chrono::seconds(30));
  const int64_t k = t.node_size;
  const int64_t n = t.num_nodes;
  auto x = at::full({3}, static_cast<double>(t.rank), at::kDouble);
  node->all_reduce(x, ReduceOp::kSum, "node sum");
  const double node_sum = static_cast<double>(t.node * k * k + k * (k - 1) / 2);
  EXPECT_TRUE(at::equal(x, at::full({3}, node_sum, at::kDouble))) << x;
  auto y = at::full({3}, static_cast<double>(t.rank), at::kDouble);
  cross->all_reduce(y, ReduceOp::kSum, "cross-node sum");
  const double cross_sum = static_cast<double>(k * n * (n - 1) / 2 + n * t.node_rank);
  EXPECT_TRUE(at::equal(y, at::full({3}, cross_sum, at::kDouble))) << y;
  cross->all_reduce(x, ReduceOp::kSum, "node sums across nodes");
  const double w = static_cast<double>(t.world_size);
  EXPECT_TRUE(at::equal(x, at::full({3}, w * (w - 1) / 2, at::kDouble))) << x;
}

}  // namespace TRAINER_UNITY_ID
