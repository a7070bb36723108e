// --dry-run --plan-ranks/--plan-device-memory/--plan-ranks-per-node (launcher/dry_run_plan.h): the
// size parser and the planning arithmetic, in closed form on one bucket of 1000 fp32 parameters
// at 4 ranks (and at 8 ranks, sharded over the world or within nodes of 4).
#include "launcher/dry_run_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ddp/errors.h"
#include "ddp/shard.h"
#include "models/lm/lm_shape.h"

namespace launcher {
namespace TRAINER_UNITY_ID {

TEST(PlanDeviceMemory, ParsesDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_device_memory("80GiB", "--plan-device-memory"), int64_t{80} << 30);
  EXPECT_EQ(parse_device_memory("81920MiB", "--plan-device-memory"), int64_t{80} << 30);
  EXPECT_EQ(parse_device_memory("80GB", "--plan-device-memory"), int64_t{80'000'000'000});
  EXPECT_EQ(parse_device_memory("1TiB", "--plan-device-memory"), int64_t{1} << 40);
  EXPECT_EQ(parse_device_memory("2TB", "--plan-device-memory"), int64_t{2'000'000'000'000});
  EXPECT_EQ(parse_device_memory("123456", "--plan-device-memory"), 123456);
}

TEST(PlanDeviceMemory, RefusesWhatIsNotASizeNamingTheFlag) {
  for (const std::string bad : {"80 gigs", "", "GiB", "-5GB", "0", "0GiB"}) {
    try {
      parse_device_memory(bad, "--plan-device-memory");
      FAIL() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--plan-device-memory '" + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

std::vector<ddp::BucketLayout> one_bucket() {
  ddp::BucketLayout b;
  b.params = {0};
  b.offsets = {0};
  b.numel = 1000;
  return {b};
}

memory::MemoryEstimate probe() {
  memory::MemoryEstimate e;
  e.activation_fixed = 1000;
  e.activation_per_sample = 500;
  e.other = 1 << 30;  // host-side data: not on the planned device
  e.loader = 1 << 30;
  return e;
}

// Room for none's 16000 bytes of state, 1000 fixed and 6 samples of 500.
const int64_t kDevice = cuda_reserve_bytes() + 16000 + 1000 + 6 * 500;

TEST(PlanDevice, EveryShardModePerRankStateAtThePlannedWorld) {
  const DevicePlan p = plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 40, 0, {4},
                                   kDevice, 1.0, ddp::ShardMode::kNone);
  ASSERT_EQ(p.modes.size(), ddp::kShardModeNames.size());
  // none: all of it; optimizer: full buckets + the reduced block (250), moments of the block;
  // gradients: the block only.
  EXPECT_EQ(p.modes[0].state.parameters, 4000);
  EXPECT_EQ(p.modes[0].state.gradients, 4000);
  EXPECT_EQ(p.modes[0].state.optimizer_state, 8000);
  EXPECT_EQ(p.modes[1].state.gradients, 5000);
  EXPECT_EQ(p.modes[1].state.optimizer_state, 2000);
  EXPECT_EQ(p.modes[2].state.parameters, 4000);
  EXPECT_EQ(p.modes[2].state.gradients, 1000);
  EXPECT_EQ(p.modes[2].state.optimizer_state, 2000);
  EXPECT_EQ(p.budget, kDevice - cuda_reserve_bytes());
}

TEST(PlanDevice, AutoPicksTheLargestMicroBatchOfTheModeAndSplitsTheGlobalBatch) {
  const DevicePlan p = plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 40, 0, {4},
                                   kDevice, 1.0, ddp::ShardMode::kNone);
  EXPECT_EQ(p.modes[0].micro_auto, 6);   // (budget - 16000 - 1000) / 500
  EXPECT_EQ(p.modes[1].micro_auto, 10);  // capped at the 40 / 4 samples per rank
  EXPECT_EQ(p.modes[2].micro_auto, 10);
  EXPECT_EQ(p.batch.per_rank, 10);
  EXPECT_EQ(p.batch.micro_batch, 6);
  EXPECT_EQ(p.batch.accumulation(), 2);  // 6 + 4
  const auto lines = describe_device_plan(p, 0);
  EXPECT_NE(lines.back().find("auto would pick 6 under ddp.shard: none"), std::string::npos)
      << lines.back();
}

TEST(PlanDevice, ConfiguredMicroBatchThatDoesNotFitNamesAModeThatDoes) {
  const PlanOf plan_of = [](ddp::ShardMode mode, bool) {
    return plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 40, 8, {4}, kDevice, 1.0,
                       mode);
  };
  DevicePlan p = plan_of(ddp::ShardMode::kNone, false);
  EXPECT_FALSE(p.modes[0].configured_fits);
  EXPECT_TRUE(p.modes[1].configured_fits);
  EXPECT_EQ(p.batch.micro_batch, 8);
  p.fits = find_fits(plan_of, 8, false, false);
  const auto lines = describe_device_plan(p, 8);
  // none, at 6 samples (halve_micro_batch); optimizer, gradients and parameters at 8.
  ASSERT_EQ(lines.size(),
            describe_device_plan(plan_of(ddp::ShardMode::kNone, false), 8).size() + 4);
  const std::string& verdict = lines[lines.size() - 5];
  EXPECT_NE(verdict.find("train.micro_batch_size = 8 does not fit under ddp.shard: none; "
                         "ddp.shard: optimizer fits"),
            std::string::npos)
      << verdict;
  EXPECT_EQ(lines[lines.size() - 4],
            "what fits: ddp.shard: none at micro-batch 6 (memory.fallback's rung "
            "halve_micro_batch, taken before the run); add to the command line: --set "
            "train.micro_batch_size=6");
  EXPECT_EQ(lines[lines.size() - 3],
            "what fits: ddp.shard: optimizer at micro-batch 8 (memory.fallback's rung "
            "shard_optimizer, taken before the run); add to the command line: --set "
            "ddp.shard=optimizer");
  EXPECT_EQ(lines[lines.size() - 2],
            "what fits: ddp.shard: gradients at micro-batch 8; add to the command line: --set "
            "ddp.shard=gradients");
}

// What fits where nothing does as configured (find_fits), in closed form at 4 ranks of one
// bucket of 1000 fp32 parameters: state per rank 16000 bytes under none, 11000 under optimizer,
// 7000 under gradients (more under parameters: two units in flight); activations 1000 fixed +
// 500 per sample, or with checkpointing 100 + 50.
memory::MemoryEstimate checkpointed_probe() {
  memory::MemoryEstimate e = probe();
  e.activation_fixed = 100;
  e.activation_per_sample = 50;
  return e;
}

PlanOf planner(int64_t micro_batch, int64_t device) {
  return [=](ddp::ShardMode mode, bool checkpointed) {
    DevicePlan p = plan_device(one_bucket(), c10::ScalarType::Undefined,
                               checkpointed ? checkpointed_probe() : probe(), 40, micro_batch, {4},
                               device, 1.0, mode);
    p.checkpointed = checkpointed;
    return p;
  };
}

const PlanFit& fit_of(const std::vector<PlanFit>& fits, ddp::ShardMode mode) {
  return fits.at(static_cast<size_t>(mode));
}

TEST(PlanFit, ActivationCheckpointingWhereNoModeFitsWithout) {
  ASSERT_EQ(planner(8, kDevice)(ddp::ShardMode::kGradients, false).modes[2].state.total(), 7000);
  // Gradients' state, 100 fixed and 8 samples of 50: nothing fits at 1 sample without
  // checkpointing (7000 + 1500), nor another mode's state with 8 checkpointed samples.
  const int64_t device = cuda_reserve_bytes() + 7000 + 100 + 8 * 50;
  const PlanOf plan_of = planner(8, device);
  const auto fits = find_fits(plan_of, 8, false, true);
  ASSERT_EQ(fits.size(), 4u);
  const PlanFit& gradients = fit_of(fits, ddp::ShardMode::kGradients);
  EXPECT_EQ(gradients.micro_batch, 8);
  EXPECT_TRUE(gradients.checkpoint_activations);
  for (const auto mode : {ddp::ShardMode::kNone, ddp::ShardMode::kOptimizer}) {
    EXPECT_EQ(fit_of(fits, mode).micro_batch, 0) << ddp::to_string(mode);
  }
  // A model that cannot checkpoint (or a probed plan): nothing fits.
  for (const PlanFit& f : find_fits(plan_of, 8, false, false)) EXPECT_EQ(f.micro_batch, 0);
  DevicePlan p = plan_of(ddp::ShardMode::kNone, false);
  p.fits = fits;
  const auto lines = describe_device_plan(p, 8);
  const auto at = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("does not fit under ddp.shard: none") != std::string::npos;
  });
  ASSERT_NE(at, lines.end());
  EXPECT_NE(at->find("; no ddp.shard mode fits as configured"), std::string::npos) << *at;
  EXPECT_EQ(*(at + 1),
            "what fits: ddp.shard: gradients at micro-batch 8 with activation checkpointing "
            "(memory.fallback's rung checkpoint_activations, taken before the run); add to the "
            "command line: --set ddp.shard=gradients --set model.checkpoint_activations=true");
  // micro_batch_size auto: auto's pick, without a micro-batch setting.
  const auto automatic = find_fits(planner(0, device), 0, false, true);
  EXPECT_EQ(fit_of(automatic, ddp::ShardMode::kGradients).micro_batch, 8);
  p = planner(0, device)(ddp::ShardMode::kNone, false);
  p.fits = automatic;
  EXPECT_NE(describe_device_plan(p, 0).back().find(
                "what fits: ddp.shard: gradients at micro-batch 8 (auto's pick) with activation "
                "checkpointing"),
            std::string::npos);
}

TEST(PlanFit, ASmallerMicroBatchBeforeActivationCheckpointing) {
  // Gradients' state, 1000 fixed and 2 samples of 500: no mode takes 8 samples, gradients 2
  // (and with checkpointing 8 would fit).
  const int64_t device = cuda_reserve_bytes() + 7000 + 1000 + 2 * 500;
  const auto fits = find_fits(planner(8, device), 8, false, true);
  const PlanFit& gradients = fit_of(fits, ddp::ShardMode::kGradients);
  EXPECT_EQ(gradients.micro_batch, 2);
  EXPECT_FALSE(gradients.checkpoint_activations);
  DevicePlan p = planner(8, device)(ddp::ShardMode::kNone, false);
  p.fits = fits;
  const auto lines = describe_device_plan(p, 8);
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "what fits: ddp.shard: gradients at micro-batch 2 (memory.fallback's rung "
                      "halve_micro_batch, taken before the run); add to the command line: --set "
                      "ddp.shard=gradients --set train.micro_batch_size=2"),
            lines.end());
}

TEST(PlanFit, NothingFitsEvenWithEveryLeverSaysWhatTheMostNeeds) {
  const int64_t device = cuda_reserve_bytes() + 5000;
  const PlanOf plan_of = planner(1, device);
  const auto fits = find_fits(plan_of, 1, false, true);
  for (const PlanFit& f : fits) EXPECT_EQ(f.micro_batch, 0);
  const PlanFit& most = fit_of(fits, ddp::ShardMode::kParameters);
  EXPECT_TRUE(most.checkpoint_activations);
  EXPECT_EQ(most.least_peak,
            plan_of(ddp::ShardMode::kParameters, true).modes[3].state.total() + 100 + 50);
  DevicePlan p = plan_of(ddp::ShardMode::kParameters, false);
  p.fits = fits;
  const auto lines = describe_device_plan(p, 1);
  EXPECT_NE(lines[lines.size() - 2].find("no ddp.shard mode fits, even with every lever"),
            std::string::npos);
  EXPECT_NE(lines.back().find("nothing fits even with every lever: ddp.shard: parameters with "
                              "activation checkpointing at micro-batch 1 needs"),
            std::string::npos)
      << lines.back();
}

TEST(PlanDevice, TargetFractionScalesTheBudgetBeforeTheReserves) {
  const DevicePlan p = plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 40, 0, {4},
                                   int64_t{1} << 30, 0.5, ddp::ShardMode::kNone);
  EXPECT_EQ(p.budget, (int64_t{1} << 29) - cuda_reserve_bytes());
}

TEST(PlanDevice, RefusesAGlobalBatchSmallerThanThePlannedRanks) {
  try {
    plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 32, 0, {64}, kDevice, 1.0,
                ddp::ShardMode::kNone);
    FAIL() << "planned 64 ranks for a global batch of 32";
  } catch (const ddp::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("--plan-ranks 64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.global_batch_size = 32"), std::string::npos);
  }
}

// ddp.shard_group: node at 8 ranks, 4 per node: every sharded mode's blocks are a node's quarter,
// twice those of 8 ranks sharded over the world (one node of 8); none does not change.
TEST(PlanDevice, HybridShardingDividesByTheRanksPerNode) {
  const auto plan = [](PlannedWorld w) {
    return plan_device(one_bucket(), c10::ScalarType::Undefined, probe(), 40, 0, w, kDevice, 1.0,
                       ddp::ShardMode::kNone);
  };
  const DevicePlan world = plan({8, 0, ddp::ShardGroup::kWorld});
  const DevicePlan node = plan({8, 4, ddp::ShardGroup::kNode});
  EXPECT_EQ(world.shard_ranks, 8);
  EXPECT_EQ(node.shard_ranks, 4);
  const auto& w = world.modes;
  const auto& n = node.modes;
  EXPECT_EQ(n[0].state.total(), w[0].state.total());
  // optimizer: moments of a block of 1000 / 4 (not / 8) elements; gradients: the block too.
  EXPECT_EQ(w[1].state.optimizer_state, 1000);
  EXPECT_EQ(n[1].state.optimizer_state, 2 * w[1].state.optimizer_state);
  EXPECT_EQ(n[2].state.gradients, 2 * w[2].state.gradients);
  EXPECT_EQ(n[2].state.optimizer_state, 2 * w[2].state.optimizer_state);
  // parameters: the blocks (1000 / 4 x 4 bytes), plus two gathered units of 4000 bytes.
  const int64_t units = 2 * 4000;
  EXPECT_EQ(n[3].state.parameters - units, 1000);
  EXPECT_EQ(n[3].state.parameters - units, 2 * (w[3].state.parameters - units));
  EXPECT_EQ(n[3].state.optimizer_state, 2 * w[3].state.optimizer_state);
  // The same as ddp::shard_footprint at 4 ranks, for every mode.
  for (const ModePlan& m : n) {
    EXPECT_EQ(m.state.total(), ddp::shard_footprint(one_bucket(), 4, m.mode).total())
        << ddp::to_string(m.mode);
  }
  // Stated under world, the nodes do not change the shards.
  EXPECT_EQ(plan({8, 4, ddp::ShardGroup::kWorld}).modes[2].state.total(), w[2].state.total());
  const auto lines = describe_device_plan(node, 0);
  EXPECT_NE(lines[1].find("a shard spans the 4 rank(s) of one node (--plan-ranks-per-node) and is "
                          "replicated on each of the 2 node(s)"),
            std::string::npos)
      << lines[1];
}

TEST(PlanDeviceRanksPerNode, RefusesRanksPerNodeThatDoNotDivideOrAreMissingUnderNode) {
  EXPECT_EQ(plan_shard_ranks({8, 0, ddp::ShardGroup::kWorld}), 8);
  EXPECT_EQ(plan_shard_ranks({8, 8, ddp::ShardGroup::kNode}), 8);
  EXPECT_EQ(plan_shard_ranks({8, 1, ddp::ShardGroup::kNode}), 1);
  const auto message = [](PlannedWorld w) {
    try {
      plan_shard_ranks(w);
    } catch (const ddp::PlanError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const auto group : {ddp::ShardGroup::kWorld, ddp::ShardGroup::kNode}) {
    EXPECT_NE(message({8, 3, group}).find("--plan-ranks-per-node 3 does not divide --plan-ranks 8"),
              std::string::npos)
        << message({8, 3, group});
    EXPECT_NE(message({8, 16, group}).find("--plan-ranks-per-node 16 does not divide"),
              std::string::npos);
  }
  EXPECT_NE(message({8, 0, ddp::ShardGroup::kNode})
                .find("ddp.shard_group is node: the shards span the ranks of one node, so the plan "
                      "needs --plan-ranks-per-node M"),
            std::string::npos)
      << message({8, 0, ddp::ShardGroup::kNode});
}

// A LoRA run planned from its shapes: the buckets, gradients and optimizer state are the
// adapters' alone, and the frozen base (fp32) is in every mode's parameters, whole on every rank
// except under parameters, which shards it by units as it shards a full model's parameters; the
// loss holds no gradient of the frozen output layer.
TEST(PlanShape, LoraPlansTheAdaptersStateAndTheFrozenBaseShardedOnlyByParameters) {
  models::LmShape shape;
  shape.family = "llama";
  shape.vocab = shape.padded_vocab = 1024;
  shape.d_model = 256;
  shape.layers = 4;
  shape.heads = 8;
  shape.kv_heads = 4;
  shape.head_dim = 32;
  shape.intermediate = 688;
  models::LmShape lora = shape;
  lora.lora_rank = 8;
  lora.lora_targets = {"q_proj", "v_proj"};
  // q_proj: A [8, 256] and B [256, 8]; v_proj: A [8, 256] and B [128, 8]; per block.
  const int64_t adapters = 4 * (8 * 256 + 256 * 8 + 8 * 256 + 128 * 8);
  EXPECT_EQ(lora.frozen_count(), shape.parameter_count());
  // The frozen output layer has no weight gradient in the loss (linear_cross_entropy).
  EXPECT_EQ(shape.activations(128, 2, false).fixed, 1024 * 256 * 4);
  EXPECT_EQ(lora.activations(128, 2, false).fixed, 0);
  EXPECT_EQ(lora.parameter_count(), shape.parameter_count() + adapters);
  ShapePlanInputs in;
  in.positions = 128;
  in.bucket_bytes = in.first_bucket_bytes = 1 << 20;
  const int64_t device = int64_t{8} << 30;
  for (const auto mode : {ddp::ShardMode::kNone, ddp::ShardMode::kParameters}) {
    const DevicePlan full = plan_shape(shape, in, 64, 1, {8}, device, 1.0, mode);
    const DevicePlan p = plan_shape(lora, in, 64, 1, {8}, device, 1.0, mode);
    const int64_t frozen = 4 * shape.parameter_count();
    const ModePlan& none = p.modes[static_cast<size_t>(ddp::ShardMode::kNone)];
    EXPECT_EQ(none.state.parameters, frozen + 4 * adapters);
    EXPECT_EQ(none.state.gradients, 4 * adapters);
    EXPECT_EQ(none.state.optimizer_state, 8 * adapters);
    const auto params = static_cast<size_t>(ddp::ShardMode::kParameters);
    for (size_t m = 0; m < p.modes.size(); ++m) {
      if (m != params) {
        EXPECT_GE(p.modes[m].state.parameters, frozen) << m;  // whole
      }
      EXPECT_LT(p.modes[m].state.optimizer_state, full.modes[m].state.optimizer_state / 20) << m;
    }
    EXPECT_LT(p.modes[params].state.parameters, frozen) << "the base is not sharded";
    if (mode == ddp::ShardMode::kParameters) {
      // The base's blocks and two of its units in flight, as the full model's parameters, plus
      // the adapters' blocks and two of their units.
      const auto adapters_layout = shape_layout(lora, mode, in);
      EXPECT_EQ(p.modes[params].state.parameters,
                full.modes[params].state.parameters +
                    ddp::shard_footprint(adapters_layout, 8, mode).parameters);
    }
  }
}

}  // namespace TRAINER_UNITY_ID
}  // namespace launcher
