// The Reducer in one process over a FakeCommunicator (bucket assignment: buckets_test.cpp).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "ddp/reducer.h"
#include "fake_communicator.h"
#include "reducer_net.h"

namespace TRAINER_UNITY_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using trainer_test::Net;

// The gradient all-reduces posted (the start-up parameter check uses collectives too).
std::vector<std::string> bucket_ops(const trainer_test::FakeCommunicator& comm) {
  std::vector<std::string> out;
  for (const auto& op : comm.ops) {
    if (op.kind == "all_reduce" && op.what.rfind("bucket ", 0) == 0) out.push_back(op.what);
  }
  return out;
}

int all_reduces(const trainer_test::FakeCommunicator& comm) {
  return static_cast<int>(bucket_ops(comm).size());
}

TEST(Reducer, GradientsAreViewsIntoTheBucketBuffers) {
  Net net;
  trainer_test::FakeCommunicator comm;
  ddp::Reducer reducer(net.named(), comm, {256, 512, false});
  for (const auto& [name, p] : net.named()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(p.grad().is_contiguous()) << name;
    EXPECT_FALSE(p.grad().is_leaf() && p.grad().data_ptr() == nullptr);
  }
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  const auto storage = net.l1->weight.grad().data_ptr();
  net.loss(at::randn({5, 8})).backward();
  reducer.finish();
  EXPECT_EQ(net.l1->weight.grad().data_ptr(), storage) << "autograd replaced the view";
}

TEST(Reducer, BucketsLaunchDuringBackwardInFixedOrder) {
  Net net;
  trainer_test::FakeCommunicator comm(/*world=*/3);
  // Small caps: several buckets, posted from the hooks while backward still runs.
  ddp::Reducer reducer(net.named(), comm, {100, 300, false});
  ASSERT_GE(reducer.layout().size(), 3u);
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  const at::Tensor x = at::randn({5, 8});
  net.loss(x).backward();
  EXPECT_EQ(all_reduces(comm), static_cast<int>(reducer.layout().size()))
      << "every bucket was posted before finish()";
  EXPECT_EQ(reducer.launched_during_backward(), reducer.layout().size());
  reducer.finish();
  std::vector<size_t> expected(reducer.layout().size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(reducer.launch_order(), expected);
  const auto posted = bucket_ops(comm);
  for (size_t b = 0; b < posted.size(); ++b) EXPECT_EQ(posted[b], "bucket " + std::to_string(b));
}

TEST(Reducer, ReadinessOutOfOrderStillPostsInBucketOrder) {
  Net net;
  trainer_test::FakeCommunicator comm;
  ddp::Reducer reducer(net.named(), comm, {100, 300, false});
  reducer.begin_micro_batch(true);
  // Mark parameters ready in registration order (the reverse of what buckets expect).
  for (size_t k = 0; k < 6; ++k) reducer.on_gradient_ready(k);
  reducer.finish();
  std::vector<size_t> expected(reducer.layout().size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(reducer.launch_order(), expected);
  EXPECT_EQ(reducer.launched_during_backward(), reducer.layout().size());
}

TEST(Reducer, SumOverRanksIsAppliedToTheGradients) {
  Net net;
  const at::Tensor x = at::randn({5, 8});
  net.loss(x).backward();
  const at::Tensor plain = net.l2->weight.grad().clone();
  net.l2->weight.mutable_grad() = at::Tensor();
  trainer_test::FakeCommunicator comm(/*world=*/4);
  ddp::Reducer reducer(net.named(), comm, {1 << 20, 1 << 20, false});
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  net.loss(x).backward();
  reducer.finish();
  EXPECT_TRUE(at::allclose(net.l2->weight.grad(), plain * 4));
}

TEST(Reducer, NoSyncMicroBatchesAccumulateWithoutCommunicating) {
  Net net;
  trainer_test::FakeCommunicator comm(/*world=*/2);
  ddp::Reducer reducer(net.named(), comm, {100, 300, false});
  const at::Tensor a = at::randn({3, 8});
  const at::Tensor b = at::randn({4, 8});
  reducer.zero_grad();
  reducer.begin_micro_batch(false);
  net.loss(a).backward();
  EXPECT_EQ(all_reduces(comm), 0);
  reducer.begin_micro_batch(true);
  net.loss(b).backward();
  reducer.finish();
  EXPECT_EQ(all_reduces(comm), static_cast<int>(reducer.layout().size()));
  const at::Tensor accumulated = net.l1->weight.grad().clone();

  // The same two micro-batches without the Reducer.
  Net twin;
  for (size_t i = 0; i < 6; ++i) twin.named()[i].second.data().copy_(net.named()[i].second.data());
  twin.loss(a).backward();
  twin.loss(b).backward();
  EXPECT_TRUE(at::allclose(accumulated, twin.l1->weight.grad() * 2));  // the fake sums 2 ranks
}

TEST(Reducer, OneRankPostsNothingAndKeepsItsGradients) {
  Net net;
  trainer_test::FakeCommunicator comm;  // world size 1
  ddp::Reducer reducer(net.named(), comm, {100, 300, false});
  const at::Tensor x = at::randn({5, 8});
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  net.loss(x).backward();
  reducer.finish();
  EXPECT_EQ(all_reduces(comm), 0);
  Net twin;
  for (size_t i = 0; i < 6; ++i) twin.named()[i].second.data().copy_(net.named()[i].second.data());
  twin.loss(x).backward();
  EXPECT_TRUE(at::equal(net.l1->weight.grad(), twin.l1->weight.grad()));
}

TEST(Reducer, ReduceAccumulatedPostsEveryBucketAfterHooklessMicroBatches) {
  // As under CUDA graph capture: every micro-batch accumulates only, then one reduction.
  Net net;
  trainer_test::FakeCommunicator comm(/*world=*/3);
  ddp::Reducer reducer(net.named(), comm, {100, 300, false});
  reducer.zero_grad();
  reducer.begin_micro_batch(false);
  net.loss(at::randn({3, 8})).backward();
  reducer.begin_micro_batch(false);
  net.loss(at::randn({2, 8})).backward();
  EXPECT_EQ(all_reduces(comm), 0);
  const at::Tensor local = net.l1->weight.grad().clone();
  reducer.reduce_accumulated();
  EXPECT_EQ(all_reduces(comm), static_cast<int>(reducer.layout().size()));
  EXPECT_TRUE(at::allclose(net.l1->weight.grad(), local * 3));
  EXPECT_THROW(reducer.reduce_accumulated(), std::logic_error);  // only after accumulating
}

TEST(Reducer, UnusedParameterIsAnErrorNamingIt) {
  Net net;
  trainer_test::FakeCommunicator comm;
  ddp::Reducer reducer(net.named(), comm, {1 << 20, 1 << 20, false});
  comm.set_step(12);
  reducer.begin_micro_batch(true);
  net.l2(at::relu(net.l1(at::randn({2, 8})))).sum().backward();  // l3 unused
  try {
    reducer.finish();
    FAIL() << "expected ParameterError";
  } catch (const ddp::ParameterError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 parameter(s) received no gradient at step 12"));
    EXPECT_THAT(e.what(), HasSubstr("l3.weight, l3.bias"));
    EXPECT_THAT(e.what(), HasSubstr("ddp.find_unused_parameters: true"));
  }
}

TEST(Reducer, FindUnusedParametersReducesZeros) {
  Net net;
  trainer_test::FakeCommunicator comm(/*world=*/2);
  ddp::Reducer reducer(net.named(), comm, {100, 300, true});
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  net.l2(at::relu(net.l1(at::randn({2, 8})))).sum().backward();
  reducer.finish();
  EXPECT_EQ(all_reduces(comm), static_cast<int>(reducer.layout().size()));
  EXPECT_TRUE(at::equal(net.l3->weight.grad(), at::zeros_like(net.l3->weight)));
  EXPECT_GT(net.l1->weight.grad().abs().sum().item<float>(), 0.f);
}

TEST(Reducer, ParameterListsThatMatchPassVerification) {
  Net net;
  trainer_test::FakeCommunicator comm(/*world=*/3);
  EXPECT_NO_THROW(ddp::verify_same_parameters(comm, net.named()));
}

}  // namespace TRAINER_UNITY_ID
