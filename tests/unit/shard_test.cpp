// Sharding (ddp/shard.h, the sharded Reducer of ddp/reducer.h) in one process: the padding and
// block arithmetic for any element count and world size, and the Reducer's reduce-scatter,
// blocks, flat parameters and ZeRO-2 buffers over a FakeCommunicator that plays rank `rank` of
// `world` identical ranks (so a reduced block is `world` times this rank's slice).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ddp/reducer.h"
#include "ddp/shard.h"
#include "fake_communicator.h"
#include "reducer_net.h"
#include "train/optimizer.h"

namespace TRAINER_UNITY_ID {

using ddp::ShardMode;
using trainer_test::Net;

TEST(ShardGeometry, PaddedBlocksCoverEveryElementOnceForAnyCountAndWorld) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t numel = 0; numel <= 40; ++numel) {
      int64_t next = 0;
      std::vector<int> owners(numel, 0);
      for (int rank = 0; rank < world; ++rank) {
        const auto s = ddp::shard_bucket(numel, world, rank);
        EXPECT_EQ(s.padded % world, 0);
        EXPECT_GE(s.padded, numel);
        EXPECT_LT(s.padded - numel, world) << "more padding than needed";
        EXPECT_EQ(s.size * world, s.padded);
        EXPECT_EQ(s.begin, next) << "blocks are contiguous, in rank order";
        next = s.end();
        // A parameter [3, 3 + 5) of the bucket: each rank owns the part inside its block.
        for (int64_t off = 0; off < numel; off += 5) {
          const int64_t count = std::min<int64_t>(5, numel - off);
          const auto [first, last] = s.owned(off, count);
          for (int64_t e = first; e < last; ++e) ++owners[e];
        }
      }
      EXPECT_EQ(next, ddp::shard_bucket(numel, world, 0).padded);
      for (int64_t e = 0; e < numel; ++e) EXPECT_EQ(owners[e], 1) << numel << " / " << world;
    }
  }
  EXPECT_THROW(ddp::shard_bucket(10, 3, 3), std::invalid_argument);
}

// Caps of 100 and 300 bytes give several buckets whose sizes do not divide by 3.
int count(const trainer_test::FakeCommunicator& comm, const std::string& kind) {
  int n = 0;
  for (const auto& op : comm.ops) n += op.kind == kind && op.what.rfind("bucket ", 0) == 0;
  return n;
}

// The unsharded reference: bucket b's reduced buffer (world x the local gradient).
std::vector<at::Tensor> reduced_unsharded(Net& source, const at::Tensor& x, int world) {
  Net twin;
  for (size_t i = 0; i < 6; ++i)
    twin.named()[i].second.data().copy_(source.named()[i].second.data());
  trainer_test::FakeCommunicator comm(world);
  ddp::Reducer reducer(twin.named(), comm, {100, 300, false});
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  twin.loss(x).backward();
  reducer.finish();
  std::vector<at::Tensor> out;
  for (const auto& b : reducer.buffers()) out.push_back(b.clone());
  return out;
}

class ShardedReducer : public ::testing::TestWithParam<ShardMode> {};

TEST_P(ShardedReducer, ReduceScattersPaddedBucketsIntoThisRanksBlock) {
  const int world = 3, rank = 1;
  Net net;
  const auto before = net.values();
  const at::Tensor x = at::randn({5, 8});
  const auto reference = reduced_unsharded(net, x, world);
  trainer_test::FakeCommunicator comm(world, rank);
  ddp::Reducer reducer(net.named(), comm,
                       {100, 300, false, c10::ScalarType::Undefined, GetParam()});
  ASSERT_GE(reducer.layout().size(), 3u);
  // The parameters kept their values and became views into one padded flat buffer per bucket.
  const auto after = net.values();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], before[i]));
  const auto blocks = reducer.parameter_shards();
  for (size_t b = 0; b < reducer.layout().size(); ++b) {
    const auto& s = reducer.shards()[b];
    EXPECT_EQ(s.padded % world, 0);
    EXPECT_EQ(blocks[b].numel(), s.size);
  }
  const bool zero2 = GetParam() == ShardMode::kGradients;
  for (auto& [name, p] : net.named()) EXPECT_EQ(p.grad().defined(), !zero2) << name;

  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  net.loss(x).backward();
  EXPECT_EQ(count(comm, "reduce_scatter"), static_cast<int>(reducer.layout().size()))
      << "every bucket posted from the hooks, during backward";
  EXPECT_EQ(count(comm, "all_reduce"), 0);
  reducer.finish();
  for (size_t b = 0; b < reducer.layout().size(); ++b) {
    const auto& s = reducer.shards()[b];
    // Block `rank` of the padded, reduced bucket; the padding (beyond numel) reduces to zero.
    const at::Tensor padded = at::constant_pad_nd(reference[b], {0, s.padded - s.numel});
    EXPECT_TRUE(at::allclose(reducer.reduced_gradients()[b], padded.narrow(0, s.begin, s.size)))
        << "bucket " << b;
  }
  // ZeRO-2 freed the full buckets once reduced; ZeRO-1 keeps them.
  for (auto& [name, p] : net.named()) EXPECT_EQ(p.grad().defined(), !zero2) << name;

  reducer.gather_parameters();
  int gathers = 0;
  for (const auto& op : comm.ops)
    gathers += op.kind == "all_gather" && op.what.rfind("parameters of bucket", 0) == 0;
  EXPECT_EQ(gathers, static_cast<int>(reducer.layout().size()));
}

TEST_P(ShardedReducer, ZeroTwoHoldsLessGradientMemoryBetweenSteps) {
  Net a, b;
  trainer_test::FakeCommunicator ca(3, 0), cb(3, 0);
  ddp::Reducer none(a.named(), ca, {100, 300, false});
  ddp::Reducer sharded(b.named(), cb, {100, 300, false, c10::ScalarType::Undefined, GetParam()});
  int64_t blocks = 0;
  for (const auto& g : sharded.reduced_gradients()) blocks += g.nbytes();
  const int64_t full = none.gradient_bytes();
  if (GetParam() == ShardMode::kGradients) {
    EXPECT_EQ(sharded.gradient_bytes(), blocks);
    EXPECT_LT(sharded.gradient_bytes(), full / 2);
  } else {
    EXPECT_GT(sharded.gradient_bytes(), full);  // the padded buckets and the blocks
  }
}

TEST_P(ShardedReducer, AccumulatesMicroBatchesThenReducesOnce) {
  const int world = 2, rank = 1;
  Net net;
  const at::Tensor x1 = at::randn({3, 8}), x2 = at::randn({4, 8});
  Net twin;
  for (size_t i = 0; i < 6; ++i) twin.named()[i].second.data().copy_(net.named()[i].second.data());
  trainer_test::FakeCommunicator comm(world, rank);
  ddp::Reducer reducer(net.named(), comm,
                       {100, 300, false, c10::ScalarType::Undefined, GetParam()});
  reducer.zero_grad();
  reducer.begin_micro_batch(false);
  net.loss(x1).backward();
  EXPECT_EQ(count(comm, "reduce_scatter"), 0);
  reducer.begin_micro_batch(true);
  net.loss(x2).backward();
  reducer.finish();
  twin.loss(x1).backward();
  twin.loss(x2).backward();
  // The twin's gradients, flattened in bucket order and padded: block `rank`, times the world.
  for (size_t b = 0; b < reducer.layout().size(); ++b) {
    const auto& layout = reducer.layout()[b];
    const auto& s = reducer.shards()[b];
    at::Tensor flat = at::zeros({s.padded});
    for (size_t j = 0; j < layout.params.size(); ++j) {
      const at::Tensor g = twin.named()[layout.params[j]].second.grad().reshape(-1);
      flat.narrow(0, layout.offsets[j], g.numel()).copy_(g);
    }
    EXPECT_TRUE(at::allclose(reducer.reduced_gradients()[b],
                             flat.narrow(0, s.begin, s.size) * world, 1e-5, 1e-7))
        << "bucket " << b;
  }
}

TEST_P(ShardedReducer, AbandonPostsEveryBucketEvenBeforeAnyGradient) {
  // The OOM protocol: a rank that failed before backward still posts every reduce-scatter.
  Net net;
  trainer_test::FakeCommunicator comm(3, 2);
  ddp::Reducer reducer(net.named(), comm,
                       {100, 300, false, c10::ScalarType::Undefined, GetParam()});
  reducer.zero_grad();
  reducer.abandon();
  EXPECT_EQ(count(comm, "reduce_scatter"), static_cast<int>(reducer.layout().size()));
}

TEST_P(ShardedReducer, MomentsRoundTripThroughFullPerParameterTensors) {
  // One rank of three: shard_from takes this rank's blocks of full tensors; unshard (the fake
  // all-gather copies this rank's block into every block) puts them back where they came from.
  Net net;
  trainer_test::FakeCommunicator comm(3, 1);
  ddp::Reducer reducer(net.named(), comm,
                       {100, 300, false, c10::ScalarType::Undefined, GetParam()});
  std::vector<at::Tensor> full;
  for (auto& [name, p] : net.named()) full.push_back(at::randn(p.sizes()));
  std::vector<at::Tensor> blocks;
  for (const auto& s : reducer.shards()) blocks.push_back(at::full({s.size}, -7.0f));
  reducer.shard_from(&full, blocks);
  const auto back = reducer.unshard(blocks, /*root=*/1);
  ASSERT_EQ(back.size(), full.size());
  for (size_t b = 0; b < reducer.layout().size(); ++b) {
    const auto& layout = reducer.layout()[b];
    const auto& s = reducer.shards()[b];
    for (size_t j = 0; j < layout.params.size(); ++j) {
      const size_t k = layout.params[j];
      const auto [first, last] = s.owned(layout.offsets[j], full[k].numel());
      const int64_t from = first - layout.offsets[j], n = last - first;
      EXPECT_TRUE(
          at::equal(back[k].reshape(-1).narrow(0, from, n), full[k].reshape(-1).narrow(0, from, n)))
          << "parameter " << k;
    }
  }
  EXPECT_TRUE(reducer.unshard(blocks, /*root=*/0).empty()) << "only the root gets tensors";
}

// ddp::shard_footprint, the arithmetic of the memory plan and --dry-run, is what the Reducer and
// the optimizer really keep, in every mode, on 1 and 3 ranks, with and without bf16 copies.
TEST(ShardFootprint, MatchesTheReducerAndTheOptimizer) {
  for (const int world : {1, 3}) {
    for (const auto wire : {c10::ScalarType::Undefined, at::kBFloat16}) {
      for (const ShardMode mode : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients,
                                   ShardMode::kParameters}) {
        Net net;
        trainer_test::FakeCommunicator comm(world, world - 1);
        ddp::Reducer reducer(net.named(), comm, {100, 300, false, wire, mode});
        std::vector<at::Tensor> params;
        for (auto& [n, p] : net.named()) params.push_back(p);
        const train::FusedAdamW adamw =
            mode == ShardMode::kNone
                ? train::FusedAdamW(params, {})
                : train::FusedAdamW(reducer.parameter_shards(), {}, reducer.reduced_gradients());
        const auto f = ddp::shard_footprint(reducer.layout(), world, mode, wire);
        EXPECT_EQ(f.gradients, reducer.gradient_bytes()) << world << " " << ddp::to_string(mode);
        EXPECT_EQ(f.optimizer_state, adamw.state_bytes()) << world << " " << ddp::to_string(mode);
        if (mode == ShardMode::kParameters) {
          // Between steps the master blocks; in a step two units at most (here one: the model).
          int64_t masters = 0;
          for (const auto& m : reducer.parameter_shards()) masters += m.nbytes();
          EXPECT_EQ(f.parameters, masters + 2 * reducer.largest_unit_bytes()) << world;
        }
      }
    }
  }
}

// The rung shard_optimizer's switch: an unsharded Reducer sharded in place holds what one built
// sharded holds (the same parameter values, blocks, gradient views) and reduce-scatters the same;
// blocks_of() slices full per-parameter tensors into the blocks shard_from() gives.
TEST(ShardInPlace, EqualsShardedFromTheStart) {
  Net a, b;
  for (size_t i = 0; i < 6; ++i) b.named()[i].second.data().copy_(a.named()[i].second.data());
  const auto before = a.values();
  trainer_test::FakeCommunicator ca(3, 1), cb(3, 1);
  ddp::Reducer switched(a.named(), ca, {100, 300, false});
  ddp::Reducer from_start(b.named(), cb,
                          {100, 300, false, c10::ScalarType::Undefined, ShardMode::kOptimizer});
  std::vector<at::Tensor> full;
  for (auto& [name, p] : a.named()) full.push_back(at::randn(p.sizes()));
  const auto sliced = switched.blocks_of(full);
  switched.zero_grad();
  switched.shard_in_place(ShardMode::kOptimizer);
  EXPECT_TRUE(switched.sharded());
  EXPECT_EQ(switched.gradient_bytes(), from_start.gradient_bytes());
  const auto after = a.values();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i], before[i])) << i;
  std::vector<at::Tensor> expected;
  for (const auto& s : from_start.shards()) expected.push_back(at::zeros({s.size}));
  from_start.shard_from(&full, expected);
  ASSERT_EQ(sliced.size(), expected.size());
  for (size_t b = 0; b < sliced.size(); ++b) EXPECT_TRUE(at::equal(sliced[b], expected[b])) << b;
  const at::Tensor x = at::randn({5, 8});
  for (auto* r : {&switched, &from_start}) {
    r->zero_grad();
    r->begin_micro_batch(true);
  }
  a.loss(x).backward();
  b.loss(x).backward();
  switched.finish();
  from_start.finish();
  EXPECT_EQ(count(ca, "reduce_scatter"), static_cast<int>(switched.layout().size()));
  for (size_t k = 0; k < switched.layout().size(); ++k) {
    EXPECT_TRUE(at::equal(switched.reduced_gradients()[k], from_start.reduced_gradients()[k])) << k;
    EXPECT_TRUE(at::equal(switched.parameter_shards()[k], from_start.parameter_shards()[k])) << k;
  }
  EXPECT_THROW(switched.shard_in_place(ShardMode::kOptimizer), std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardedReducer,
                         ::testing::Values(ShardMode::kOptimizer, ShardMode::kGradients));

TEST(ShardedOptimizer, FusedAdamWOverFlatBlocksEqualsPerParameter) {
  // World size 1: the one block is the whole bucket, so the flat update must equal the
  // per-parameter one exactly.
  Net a, b;
  for (size_t i = 0; i < 6; ++i) b.named()[i].second.data().copy_(a.named()[i].second.data());
  trainer_test::FakeCommunicator ca, cb;
  ddp::Reducer none(a.named(), ca, {100, 300, false});
  ddp::Reducer sharded(b.named(), cb,
                       {100, 300, false, c10::ScalarType::Undefined, ShardMode::kOptimizer});
  std::vector<at::Tensor> pa;
  for (auto& [n, p] : a.named()) pa.push_back(p);
  train::FusedAdamW oa(pa, {});
  train::FusedAdamW ob(sharded.parameter_shards(), {}, sharded.reduced_gradients());
  EXPECT_EQ(ob.state_bytes(), oa.state_bytes());  // no padding at one rank
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({6, 8});
    for (auto* r : {&none, &sharded}) {
      r->zero_grad();
      r->begin_micro_batch(true);
    }
    a.loss(x).backward();
    b.loss(x).backward();
    none.finish();
    sharded.finish();
    oa.step(1e-2);
    ob.step(1e-2);
  }
  const auto va = a.values(), vb = b.values();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_TRUE(at::allclose(va[i], vb[i], 1e-6, 1e-7)) << i;
}

}  // namespace TRAINER_UNITY_ID
