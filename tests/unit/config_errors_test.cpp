// Config errors: every bad input is a ConfigError naming the key and file:line (or the --set that
// caused it).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <unistd.h>

#include "config/config.h"
#include "config/schema.h"
#include "config_test_util.h"

namespace TRAINER_UNITY_ID {

using namespace config_test;

// ---- unknown keys and sections ----

TEST(ConfigErrors, UnknownKeySuggestsTheNearestKey) {
  const std::string message = config_error(kMinimal + "  stesp: 10\n");
  EXPECT_EQ(message, "bad.yaml:5: unknown key 'train.stesp' (did you mean 'train.steps'?)");
}

TEST(ConfigErrors, UnknownKeyFarFromEveryKeyHasNoSuggestion) {
  const std::string message = config_error(kMinimal + "  zzzzzzzzzz: 1\n");
  EXPECT_EQ(message, "bad.yaml:5: unknown key 'train.zzzzzzzzzz'");
}

TEST(ConfigErrors, UnknownSectionListsTheSections) {
  const std::string message = config_error(kMinimal + "optimizer:\n  lr: 0.1\n");
  expect_one_problem(message, "bad.yaml:5",
                     {"unknown section 'optimizer'",
                      "sections are: model, data, train, eval, ddp, memory, checkpoint, log"});
}

// A misspelt section should get the same did-you-mean help as a misspelt key.
TEST(ConfigErrors, UnknownSectionSuggestsTheNearestSection) {
  const std::string message = config_error(kMinimal + "lgo:\n  every: 5\n");
  expect_one_problem(message, "bad.yaml:5", {"unknown section 'lgo'", "(did you mean 'log'?)"});
}

// A key that is itself a mapping or list is a config error, not an escaped yaml-cpp exception.
TEST(ConfigErrors, NonScalarKeyIsAConfigError) {
  const std::string message = config_error(kMinimal + "  [steps, lr]: 1\n");
  EXPECT_THAT(message, StartsWith("bad.yaml:5: "));
}

// ---- wrong types ----

// train.skip_spikes is off or a map of loss_z, grad_norm_z and window: each bad part is named.
TEST(ConfigErrors, SkipSpikesNamesTheBadPart) {
  EXPECT_EQ(config_error(kMinimal + "  skip_spikes: {loss_z: -1}\n"),
            "bad.yaml:5: train.skip_spikes: loss_z: -1 is below 0");
  EXPECT_EQ(config_error(kMinimal + "  skip_spikes: {window: 1}\n"),
            "bad.yaml:5: train.skip_spikes: window: 1 is below 2");
  EXPECT_EQ(config_error(kMinimal + "  skip_spikes: {loss: 3}\n"),
            "bad.yaml:5: train.skip_spikes: loss: unknown key (expected loss_z, grad_norm_z, "
            "window)");
  EXPECT_EQ(config_error(kMinimal + "  skip_spikes: {loss_z: 0, grad_norm_z: 0}\n"),
            "bad.yaml:5: train.skip_spikes: loss_z and grad_norm_z are both 0: nothing would be "
            "judged (write train.skip_spikes: off)");
  EXPECT_THAT(config_error(kMinimal + "  skip_spikes: 6\n"),
              StartsWith("bad.yaml:5: train.skip_spikes: expected off or a map"));
  EXPECT_EQ(config_error(kMinimal + "  inject_spike: 'x'\n"),
            "bad.yaml:5: train.inject_spike: 'x' is not a step (an integer >= 1; several: 'STEP; "
            "STEP')");
}

TEST(ConfigErrors, StringForInteger) {
  const std::string message = config_error(kMinimal + "  steps: ten\n");
  EXPECT_EQ(message, "bad.yaml:5: train.steps: expected an integer, got 'ten'");
}

TEST(ConfigErrors, RealForInteger) {
  const std::string message = config_error(kMinimal + "  warmup_steps: 2.5\n");
  EXPECT_EQ(message, "bad.yaml:5: train.warmup_steps: expected an integer, got '2.5'");
}

TEST(ConfigErrors, MappingForScalar) {
  const std::string message = config_error(kMinimal + "  steps:\n    value: 5\n");
  EXPECT_EQ(message, "bad.yaml:5: train.steps: expected an integer, got a mapping");
}

TEST(ConfigErrors, ListForNumber) {
  const std::string message = config_error(kMinimal + "  lr: [0.1, 0.2]\n");
  EXPECT_EQ(message, "bad.yaml:5: train.lr: expected a number, got a list");
}

TEST(ConfigErrors, ListForChoice) {
  const std::string message = config_error(kMinimal + "  device: [cpu]\n");
  EXPECT_EQ(message, "bad.yaml:5: train.device: expected one of the choices, got a list");
}

TEST(ConfigErrors, EmptyValueForInteger) {
  const std::string message = config_error(kMinimal + "  steps:\n");
  EXPECT_EQ(message, "bad.yaml:5: train.steps: expected an integer, got no value");
}

TEST(ConfigErrors, MappingForString) {
  const std::string message = config_error(kMinimal + "checkpoint:\n  dir:\n    path: x\n");
  EXPECT_EQ(message, "bad.yaml:6: checkpoint.dir: expected a string, got a mapping");
}

TEST(ConfigErrors, ResumeAutoNeedsACheckpointDirectory) {
  const std::string message = config_error(kMinimal + "checkpoint:\n  resume: auto\n");
  EXPECT_EQ(message, "bad.yaml:6: checkpoint.resume: 'auto' looks for the latest checkpoint in "
                     "checkpoint.dir, which is not set");
}

TEST(ConfigErrors, SectionThatIsNotAMapping) {
  const std::string message = config_error(kMinimal + "ddp: mpi\n");
  EXPECT_EQ(message, "bad.yaml:5: section 'ddp' must be a mapping of keys");
}

TEST(ConfigErrors, TopLevelThatIsNotAMapping) {
  // Nothing was read, so the required keys are missing too.
  const std::string message = config_error("- model\n- train\n");
  EXPECT_THAT(message, StartsWith("3 problems in the configuration:\n"
                                  "bad.yaml:1: the top level must be a mapping of sections"));
  EXPECT_THAT(message, HasSubstr("\nbad.yaml: model.name: required, but not given"));
  EXPECT_THAT(message, HasSubstr("\nbad.yaml: train.global_batch_size: required, but not given"));
}

// A required key given with a bad value is reported once, for its value, not also as missing.
TEST(ConfigErrors, BadRequiredValueIsNotAlsoReportedMissing) {
  const std::string message =
      config_error("model:\n  name: mlp\ntrain:\n  global_batch_size: lots\n");
  expect_one_problem(message, "bad.yaml:4",
                     {"train.global_batch_size: expected an integer, got 'lots'"});
}

// ---- ranges ----

TEST(ConfigErrors, IntegerAboveItsRange) {
  const std::string message =
      config_error("model:\n  name: mlp\n  depth: 300\ntrain:\n  global_batch_size: 64\n");
  EXPECT_EQ(message, "bad.yaml:3: model.depth: 300 is out of range: must be in 0 .. 256");
}

TEST(ConfigErrors, IntegerBelowItsMinimum) {
  const std::string message = config_error(kMinimal + "  steps: 0\n");
  EXPECT_EQ(message, "bad.yaml:5: train.steps: 0 is out of range: must be >= 1");
}

TEST(ConfigErrors, IntegerBeyondInt64) {
  const std::string message = config_error(kMinimal + "  steps: 99999999999999999999\n");
  EXPECT_EQ(message, "bad.yaml:5: train.steps: '99999999999999999999' is out of range");
}

TEST(ConfigErrors, NegativeSeed) {
  const std::string message = config_error(kMinimal + "data:\n  seed: -1\n");
  EXPECT_EQ(message, "bad.yaml:6: data.seed: -1 is out of range: must be >= 0");
}

TEST(ConfigErrors, RealAtAnOpenLowerBound) {
  const std::string message = config_error(kMinimal + "  lr: 0\n");
  EXPECT_EQ(message, "bad.yaml:5: train.lr: 0 is out of range: must be in (0, 10]");
}

TEST(ConfigErrors, RealAtAnOpenUpperBound) {
  const std::string message = config_error(kMinimal + "  beta2: 1\n");
  EXPECT_EQ(message, "bad.yaml:5: train.beta2: 1 is out of range: must be in [0, 1)");
}

TEST(ConfigErrors, RealAboveAClosedUpperBound) {
  const std::string message = config_error(kMinimal + "data:\n  label_noise: 1.5\n");
  EXPECT_EQ(message, "bad.yaml:6: data.label_noise: 1.5 is out of range: must be in [0, 1]");
}

TEST(ConfigErrors, RealThatIsNotFinite) {
  const std::string message = config_error(kMinimal + "  grad_clip: nan\n");
  EXPECT_EQ(message, "bad.yaml:5: train.grad_clip: expected a number, got 'nan'");
}

// ---- choices ----

TEST(ConfigErrors, BadDeviceChoice) {
  const std::string message = config_error(kMinimal + "  device: tpu\n");
  EXPECT_EQ(message, "bad.yaml:5: train.device: 'tpu' is not one of: auto, cpu, cuda");
}

TEST(ConfigErrors, BadModelName) {
  const std::string message =
      config_error("model:\n  name: nope\ntrain:\n  global_batch_size: 64\n");
  EXPECT_THAT(message, HasSubstr("bad.yaml:2: model.name: 'nope' is not one of: cnn, gemma3, gpt, "
                                 "llama, mistral, mlp, qwen2, qwen3, recommender, sequence"));
}

// ---- required keys ----

TEST(ConfigErrors, MissingGlobalBatchSize) {
  const std::string message = config_error("model:\n  name: mlp\ntrain:\n  steps: 50\n");
  EXPECT_EQ(message,
            "bad.yaml: train.global_batch_size: required, but not given (add it to the 'train' "
            "section or pass --set train.global_batch_size=...)");
}

TEST(ConfigErrors, MissingModelName) {
  const std::string message = config_error("model:\n  depth: 3\ntrain:\n  global_batch_size: 8\n");
  EXPECT_EQ(message,
            "bad.yaml: model.name: required, but not given (add it to the 'model' section or pass "
            "--set model.name=...)");
}

TEST(ConfigErrors, EmptyFileReportsEveryRequiredKey) {
  const std::string message = config_error("");
  EXPECT_THAT(message, StartsWith("2 problems in the configuration:\n"));
  EXPECT_THAT(message, HasSubstr("\nbad.yaml: model.name: required, but not given"));
  EXPECT_THAT(message, HasSubstr("\nbad.yaml: train.global_batch_size: required, but not given"));
}

// ---- duplicates (yaml-cpp keeps both entries of a repeated key) ----

TEST(ConfigErrors, KeyGivenTwice) {
  const std::string message = config_error(kMinimal + "  global_batch_size: 32\n");
  EXPECT_EQ(message, "bad.yaml:5: train.global_batch_size: given twice (first at bad.yaml:4)");
}

TEST(ConfigErrors, KeyGivenTwiceInARepeatedSection) {
  const std::string message = config_error(kMinimal + "  steps: 70\ntrain:\n  steps: 90\n");
  EXPECT_EQ(message, "bad.yaml:7: train.steps: given twice (first at bad.yaml:5)");
}

// ---- YAML syntax ----

TEST(ConfigErrors, TabIndentationIsInvalidYaml) {
  const std::string message = config_error("model:\n  name: mlp\ntrain:\n\tsteps: 5\n");
  expect_one_problem(message, "bad.yaml:4", {"not valid YAML"});
}

TEST(ConfigErrors, BadIndentationIsInvalidYaml) {
  const std::string message = config_error(
      "model:\n  name: mlp\ntrain:\n  global_batch_size: 64\n  lr: 0.1\n   steps: 2\n");
  expect_one_problem(message, "bad.yaml:6", {"not valid YAML"});
}

// ---- relations between keys ----

TEST(ConfigErrors, WarmupNotBelowSteps) {
  const std::string message = config_error(kMinimal + "  steps: 10\n  warmup_steps: 10\n");
  EXPECT_EQ(message, "bad.yaml:6: train.warmup_steps = 10 must be smaller than train.steps = 10");
}

TEST(ConfigErrors, DefaultWarmupNotBelowStepsIsReportedAtSteps) {
  const std::string message = config_error(kMinimal + "  steps: 5\n");
  EXPECT_EQ(message,
            "bad.yaml:5: train.warmup_steps (default) = 10 must be smaller than train.steps = 5");
}

// Samples under a parameter-sharded model gather its units in step on every rank (issue 39): the
// combination is a valid configuration.
TEST(ConfigErrors, SamplesWhileTrainingWithShardedParametersAreAccepted) {
  const Config c = parse_config(kMinimal, "good.yaml",
                                {"ddp.shard=parameters", "train.sample_every=10",
                                 "memory.fallback=[halve_micro_batch, shard_parameters]"});
  EXPECT_EQ(c.train.sample_every, 10);
  EXPECT_EQ(c.ddp.shard, ddp::ShardMode::kParameters);
}

// Hybrid sharding shards within the node: with nothing sharded it means nothing.
TEST(ConfigErrors, ShardGroupNodeWithoutShardingIsRefused) {
  const std::string message = config_error(kMinimal, {"ddp.shard_group=node"});
  expect_one_problem(message, "--set ddp.shard_group=node",
                     {"ddp.shard_group: 'node' shards within each node, but ddp.shard is none"});
  EXPECT_THAT(config_error(kMinimal, {"ddp.shard_group=rack"}),
              ::testing::HasSubstr("ddp.shard_group"));
  const Config hybrid =
      parse_config(kMinimal, "good.yaml", {"ddp.shard=gradients", "ddp.shard_group=node"});
  EXPECT_EQ(hybrid.ddp.shard_group, ddp::ShardGroup::kNode);
  EXPECT_EQ(parse_config(kMinimal, "good.yaml").ddp.shard_group, ddp::ShardGroup::kWorld);
  EXPECT_EQ(
      parse_config(kMinimal, "good.yaml",
                   {"ddp.shard=gradients", "ddp.shard_group=node", "checkpoint.format=sharded"})
          .checkpoint.format,
      checkpoint::Format::kSharded);
}

// Muon updates the hidden layers' weight matrices, which LoRA freezes: refused at start-up,
// naming both keys; either alone is accepted.
TEST(ConfigErrors, MuonWithLoraIsRefused) {
  const std::string message = config_error(kMinimal, {"train.optimizer=muon", "model.lora_rank=4"});
  expect_one_problem(message, "--set train.optimizer=muon",
                     {"train.optimizer: muon updates the hidden layers' weight matrices, which "
                      "model.lora_rank = 4 freezes",
                      "use train.optimizer: adamw"});
  EXPECT_EQ(parse_config(kMinimal, "good.yaml", {"train.optimizer=muon"}).train.optimizer,
            train::OptimizerKind::kMuon);
  EXPECT_EQ(parse_config(kMinimal, "good.yaml", {"model.lora_rank=4"}).model.lora_rank, 4);
}

TEST(ConfigErrors, WarmupRelationBrokenByAnOverride) {
  const std::string message = config_error(kMinimal, {"train.steps=8"});
  EXPECT_EQ(message, "--set train.steps=8: train.warmup_steps (default) = 10 must be smaller than "
                     "train.steps = 8");
}

// A rejected value is reported once; the relation is not checked against a value the user never
// gave (here the default warmup of 10, which the message would attribute to line 6).
TEST(ConfigErrors, RejectedValueIsNotUsedInRelations) {
  const std::string message = config_error(kMinimal + "  steps: 5\n  warmup_steps: abc\n");
  EXPECT_EQ(message, "bad.yaml:6: train.warmup_steps: expected an integer, got 'abc'");
}

// ---- --set ----

TEST(ConfigErrors, OverrideWithoutEquals) {
  const std::string message = config_error(kMinimal, {"train.steps"});
  EXPECT_EQ(message, "--set train.steps: expected --set section.key=value");
}

TEST(ConfigErrors, OverrideWithoutKey) {
  const std::string message = config_error(kMinimal, {"=5"});
  EXPECT_EQ(message, "--set =5: expected --set section.key=value");
}

TEST(ConfigErrors, OverrideOfAnUnknownKey) {
  const std::string message = config_error(kMinimal, {"train.stpes=5"});
  EXPECT_EQ(message,
            "--set train.stpes=5: unknown key 'train.stpes' (did you mean 'train.steps'?)");
}

TEST(ConfigErrors, OverrideWithABadValue) {
  const std::string message = config_error(kMinimal, {"train.steps=abc"});
  EXPECT_EQ(message, "--set train.steps=abc: train.steps: expected an integer, got 'abc'");
}

TEST(ConfigErrors, OverrideWithUnparsableYaml) {
  const std::string message = config_error(kMinimal, {"train.lr=[0.1"});
  expect_one_problem(message, "--set train.lr=[0.1", {"train.lr: cannot parse the value"});
}

TEST(ConfigErrors, OverrideOutOfRange) {
  const std::string message = config_error(kMinimal, {"train.lr=0"});
  EXPECT_EQ(message, "--set train.lr=0: train.lr: 0 is out of range: must be in (0, 10]");
}

// ---- micro_batch_size ----

TEST(ConfigErrors, MicroBatchSizeZero) {
  const std::string message = config_error(kMinimal + "  micro_batch_size: 0\n");
  EXPECT_EQ(message,
            "bad.yaml:5: train.micro_batch_size: 0 is out of range: must be >= 1 or 'auto'");
}

TEST(ConfigErrors, MicroBatchSizeWord) {
  const std::string message = config_error(kMinimal + "  micro_batch_size: half\n");
  EXPECT_EQ(
      message,
      "bad.yaml:5: train.micro_batch_size: expected a positive integer or 'auto', got 'half'");
}

// ---- several at once ----

TEST(ConfigErrors, SeveralProblemsAreListedTogetherInOrder) {
  const std::string message =
      config_error(kMinimal + "  steps: ten\n  lr: 0\n  devcie: cpu\n", {"log.every=0"});
  EXPECT_EQ(message, "4 problems in the configuration:\n"
                     "bad.yaml:5: train.steps: expected an integer, got 'ten'\n"
                     "bad.yaml:6: train.lr: 0 is out of range: must be in (0, 10]\n"
                     "bad.yaml:7: unknown key 'train.devcie' (did you mean 'train.device'?)\n"
                     "--set log.every=0: log.every: 0 is out of range: must be >= 1");
}

// ---- load_config ----

TEST(ConfigErrors, LoadConfigOfAMissingFileNamesThePath) {
  const std::string path = "/nonexistent-dir/run.yaml";
  try {
    config::load_config(path);
    FAIL() << "load_config accepted a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": cannot read the config file: No such file or directory");
  }
}

}  // namespace TRAINER_UNITY_ID
