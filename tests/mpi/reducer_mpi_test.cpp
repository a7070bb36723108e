// The Reducer across real ranks over MPI: parameter checks and unused parameters.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "ddp/reducer.h"
#include "mpi_test_env.h"

namespace {

using ::testing::HasSubstr;

std::unique_ptr<ddp::Communicator> world() {
  return trainer_test::runtime().world(std::chrono::seconds(30));
}

TEST(ReducerMpi, ShapeMismatchNamesParameterAndRanks) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::nn::Linear a(8, comm->rank() == 1 ? 17 : 16);
  torch::nn::Linear b(16, 4);
  ddp::NamedParameters params = {{"a.weight", a->weight}, {"a.bias", a->bias}, {"b.weight", b->weight}};
  try {
    ddp::verify_same_parameters(*comm, params);
    FAIL() << "expected ParameterError on every rank";
  } catch (const ddp::ParameterError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter #0 differs"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0: 'a.weight' [16, 8] Float"));
    EXPECT_THAT(e.what(), HasSubstr("rank 1: 'a.weight' [17, 8] Float"));
  }
}

TEST(ReducerMpi, MissingParameterOnOneRankIsNamed) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::nn::Linear a(8, 16);
  ddp::NamedParameters params = {{"a.weight", a->weight}};
  if (comm->rank() != comm->size() - 1) params.emplace_back("a.bias", a->bias);
  try {
    ddp::verify_same_parameters(*comm, params);
    FAIL() << "expected ParameterError on every rank";
  } catch (const ddp::ParameterError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter #1 differs"));
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank {}: (no such parameter)", comm->size() - 1)));
  }
}

TEST(ReducerMpi, DtypeMismatchIsCaught) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  at::Tensor p = at::zeros({4}, comm->rank() == 0 ? at::kFloat : at::kDouble).requires_grad_();
  EXPECT_THROW(ddp::verify_same_parameters(*comm, {{"p", p}}), ddp::ParameterError);
}

// Rank r leaves the head unused on odd ranks; with find_unused_parameters the head's gradient is
// the sum over the ranks that used it, in closed form: the head's gradient on rank r is
// d/dW sum(W h) = sum over the batch of h, and every rank uses the same inputs.
TEST(ReducerMpi, FindUnusedParametersSumsOnlyUsers) {
  auto comm = world();
  torch::nn::Linear body(4, 4);
  torch::nn::Linear head(4, 1);
  for (auto& p : body->parameters()) p.data().fill_(0.1);
  for (auto& p : head->parameters()) p.data().fill_(0.2);
  ddp::NamedParameters params = {{"body.weight", body->weight}, {"body.bias", body->bias},
                                 {"head.weight", head->weight}, {"head.bias", head->bias}};
  ddp::Reducer reducer(params, *comm, {16, 16, /*find_unused=*/true});
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  const at::Tensor x = at::ones({3, 4});
  const at::Tensor h = body(x);
  const bool uses_head = comm->rank() % 2 == 0;
  (uses_head ? head(h).sum() : h.sum()).backward();
  reducer.finish();
  int users = 0;
  for (int r = 0; r < comm->size(); ++r) users += r % 2 == 0;
  // dL/d head.bias = batch size per user.
  EXPECT_FLOAT_EQ(head->bias.grad().item<float>(), 3.0f * users);
  // Identical on every rank.
  at::Tensor g = head->weight.grad().clone();
  at::Tensor g_max = g.clone();
  comm->all_reduce(g_max, ddp::ReduceOp::kMax);
  EXPECT_TRUE(at::equal(g, g_max));
}

TEST(ReducerMpi, UnusedParameterWithoutTheFlagFailsOnEveryRank) {
  auto comm = world();
  torch::nn::Linear body(4, 4);
  torch::nn::Linear head(4, 1);
  ddp::NamedParameters params = {{"body.weight", body->weight}, {"body.bias", body->bias},
                                 {"head.weight", head->weight}, {"head.bias", head->bias}};
  ddp::Reducer reducer(params, *comm, {1 << 20, 1 << 20, false});
  reducer.begin_micro_batch(true);
  body(at::ones({2, 4})).sum().backward();
  try {
    reducer.finish();
    FAIL() << "expected ParameterError";
  } catch (const ddp::ParameterError& e) {
    EXPECT_THAT(e.what(), HasSubstr("head.weight, head.bias"));
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank {}", comm->rank())));
  }
}

}  // namespace
