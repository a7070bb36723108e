// The Reducer across real ranks over MPI: parameter checks, unused parameters, and the removal
// of its hooks.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <optional>

#include "common/mpi_test_env.h"
#include "ddp/reducer.h"
#include "train/optimizer.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

std::unique_ptr<ddp::Communicator> world() {
  return trainer_test::runtime().world(std::chrono::seconds(30));
}

TEST(ReducerMpi, ShapeMismatchNamesParameterAndRanks) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  torch::nn::Linear a(8, comm->rank() == 1 ? 17 : 16);
  torch::nn::Linear b(16, 4);
  ddp::NamedParameters params = {
      {"a.weight", a->weight}, {"a.bias", a->bias}, {"b.weight", b->weight}};
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
  ddp::NamedParameters params = {{"body.weight", body->weight},
                                 {"body.bias", body->bias},
                                 {"head.weight", head->weight},
                                 {"head.bias", head->bias}};
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
  ddp::NamedParameters params = {{"body.weight", body->weight},
                                 {"body.bias", body->bias},
                                 {"head.weight", head->weight},
                                 {"head.bias", head->bias}};
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

// Passes every operation on to `inner`, counting the reductions (all-reduce, reduce-scatter).
class CountingCommunicator final : public ddp::Communicator {
 public:
  explicit CountingCommunicator(ddp::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view backend() const override { return inner_.backend(); }
  ddp::WorkPtr all_reduce_async(at::Tensor t, ddp::ReduceOp op, std::string_view what) override {
    ++reductions;
    return inner_.all_reduce_async(std::move(t), op, what);
  }
  ddp::WorkPtr broadcast_async(at::Tensor t, int root, std::string_view what) override {
    return inner_.broadcast_async(std::move(t), root, what);
  }
  ddp::WorkPtr all_gather_async(at::Tensor out, at::Tensor in, std::string_view what) override {
    return inner_.all_gather_async(std::move(out), std::move(in), what);
  }
  ddp::WorkPtr reduce_scatter_async(at::Tensor out, at::Tensor in, ddp::ReduceOp op,
                                    std::string_view what) override {
    ++reductions;
    return inner_.reduce_scatter_async(std::move(out), std::move(in), op, what);
  }
  ddp::WorkPtr barrier_async(std::string_view what) override { return inner_.barrier_async(what); }

  int reductions = 0;

 private:
  ddp::Communicator& inner_;
};

// A Reducer destroyed in the middle of a step (as a memory fallback rebuilds it) takes its hooks
// with it: a backward afterwards reduces nothing and leaves each rank its own gradient. A hook
// left behind would find the dead Reducer still syncing and post its buckets (or crash). Ranks
// see different inputs, so a reduced gradient would differ from the local one. On one rank the
// Reducer posts nothing in any case, so the test needs two or more.
class ReducerMpiHooks : public ::testing::TestWithParam<ddp::ShardMode> {};

TEST_P(ReducerMpiHooks, AreRemovedWithTheReducer) {
  auto real = world();
  if (real->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CountingCommunicator comm(*real);
  torch::nn::Linear net(8, 4);
  ddp::NamedParameters params = {{"weight", net->weight}, {"bias", net->bias}};
  at::manual_seed(100 + comm.rank());
  const at::Tensor x = at::randn({3, 8});
  std::optional<ddp::Reducer> reducer;
  reducer.emplace(params, comm,
                  ddp::ReducerOptions{
                      .first_bucket_bytes = 1 << 20, .bucket_bytes = 1 << 20, .shard = GetParam()});
  reducer->zero_grad();
  reducer->begin_micro_batch(true);
  const int before = comm.reductions;
  reducer.reset();
  for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
  net(x).sum().backward();
  EXPECT_EQ(comm.reductions, before);
  // d/dW sum(W x + b) = the sum of the batch's x in every row; d/db = the batch size.
  EXPECT_TRUE(at::allclose(net->weight.grad(), x.sum(0).expand({4, 8})));
  EXPECT_TRUE(at::allclose(net->bias.grad(), at::full({4}, 3.0)));
}

INSTANTIATE_TEST_SUITE_P(Modes, ReducerMpiHooks,
                         ::testing::Values(ddp::ShardMode::kNone, ddp::ShardMode::kGradients),
                         [](const auto& info) {
                           return std::string(ddp::kShardModeNames[static_cast<int>(info.param)]);
                         });

// The rider (ReducerOptions::rider_slots, the spike guard's global loss) is summed over ranks in
// the first bucket's all-reduce, with and without a reduce_dtype copy, and leaves the gradients
// exactly as a reducer without it reduces them.
void expect_rider_sums(c10::ScalarType reduce_dtype) {
  auto comm = world();
  torch::nn::Linear a(4, 3), b(4, 3);
  for (auto& p : a->parameters()) p.data().fill_(0.25);
  for (auto& p : b->parameters()) p.data().fill_(0.25);
  ddp::Reducer plain(
      {{"w", a->weight}, {"b", a->bias}}, *comm,
      {16, 16, false, reduce_dtype, ddp::ShardMode::kNone, {}, c10::ScalarType::Undefined});
  ddp::Reducer riding(
      {{"w", b->weight}, {"b", b->bias}}, *comm,
      {16, 16, false, reduce_dtype, ddp::ShardMode::kNone, {}, c10::ScalarType::Undefined, 2});
  ASSERT_FALSE(plain.rider().defined());
  ASSERT_EQ(riding.rider().numel(), 2);
  const at::Tensor x = at::arange(8, at::kFloat).view({2, 4}) * (comm->rank() + 1);
  for (auto* r : {&plain, &riding}) {
    r->zero_grad();
    r->begin_micro_batch(true);
  }
  riding.rider().copy_(at::tensor({1.0f * (comm->rank() + 1), 0.5f}));
  a(x).sum().backward();
  b(x).sum().backward();
  plain.finish();
  riding.finish();
  const double n = comm->size();
  EXPECT_EQ(riding.rider()[0].item<double>(), n * (n + 1) / 2);
  EXPECT_EQ(riding.rider()[1].item<double>(), 0.5 * n);
  EXPECT_TRUE(at::equal(a->weight.grad(), b->weight.grad()));
  EXPECT_TRUE(at::equal(a->bias.grad(), b->bias.grad()));
}

TEST(ReducerMpi, RiderIsSummedWithTheFirstBucket) { expect_rider_sums(c10::ScalarType::Undefined); }

TEST(ReducerMpi, RiderIsSummedInTheReduceDtype) { expect_rider_sums(at::kBFloat16); }

// Sharded gradients: the rider goes with the clipper's all-reduce of the squared norms instead.
TEST(ReducerMpi, ClipperRiderIsSummedWithTheNorm) {
  auto comm = world();
  const double r = comm->rank() + 1;
  train::GradClipper clipper({at::full({4}, r)}, comm.get(), 1);
  ASSERT_EQ(clipper.rider().numel(), 1);
  clipper.rider().fill_(r);
  clipper.clip(0);
  const double n = comm->size();
  double squares = 0;
  for (int k = 1; k <= comm->size(); ++k) squares += 4.0 * k * k;
  EXPECT_FLOAT_EQ(clipper.rider().item<float>(), static_cast<float>(n * (n + 1) / 2));
  EXPECT_FLOAT_EQ(clipper.norm().item<float>(), static_cast<float>(std::sqrt(squares)));
  EXPECT_FALSE(train::GradClipper({at::ones({4})}, nullptr, 1).rider().defined());
}

}  // namespace TRAINER_UNITY_ID
