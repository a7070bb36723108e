// Choice keys are parsed once, at the config boundary, into the enums the option structs hold:
// every name round-trips name -> value -> name (what --print-config writes), each name reaches
// the enum value it names, and an unknown name is an error naming the key and the choices.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/schema.h"
#include "config_test_util.h"

namespace TRAINER_UNITY_ID {

using namespace config_test;

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = text.find(separator, start)) != std::string::npos;
       start = at + separator.size()) {
    parts.push_back(text.substr(start, at - start));
  }
  parts.push_back(text.substr(start));
  return parts;
}

// The value of `path` in --print-config's text for `config`.
std::string printed(const Config& config, const std::string& path) {
  const std::string key = path.substr(path.find('.') + 1);
  std::istringstream lines(config::config_to_yaml(config));
  std::string section, line;
  for (std::string l; std::getline(lines, l);) {
    if (!l.empty() && l[0] != ' ') section = l.substr(0, l.size() - 1);
    if (section + "." + key == path && l.rfind("  " + key + ": ", 0) == 0)
      return l.substr(key.size() + 4);
  }
  ADD_FAILURE() << path << " is not in the printed configuration";
  return "";
}

TEST(ConfigChoices, EveryNameRoundTripsThroughTheConfig) {
  int choices = 0;
  for (const auto& key : config::schema::keys()) {
    if (key.type != "choice") continue;
    for (const auto& name : split(key.range, " | ")) {
      SCOPED_TRACE(key.path + " = " + name);
      // data.path: data.dataset movielens requires one; ddp.shard: ddp.shard_group node does.
      const Config c = parse_config(kMinimal, "run.yaml",
                                    {"data.path=d", "ddp.shard=optimizer", key.path + "=" + name});
      EXPECT_EQ(key.get(c), name);
      EXPECT_EQ(printed(c, key.path), name);
      EXPECT_EQ(key.get(parse_config(config::config_to_yaml(c), "dump.yaml")), name);
      ++choices;
    }
  }
  EXPECT_GE(choices, 30);  // every choice key was seen, the enum-backed ones included
}

TEST(ConfigChoices, NamesReachTheEnumValuesTheyName) {
  const auto with = [](const std::string& set) {
    return parse_config(kMinimal, "run.yaml", {set});
  };
  EXPECT_EQ(with("train.channels_last=on").train.channels_last, train::Switch::kOn);
  EXPECT_EQ(with("train.channels_last=off").train.channels_last, train::Switch::kOff);
  EXPECT_EQ(with("train.channels_last=auto").train.channels_last, train::Switch::kAuto);
  EXPECT_EQ(with("train.tf32=off").train.tf32, train::Switch::kOff);
  EXPECT_EQ(with("train.precision=bf16").train.precision, train::Precision::kBf16);
  EXPECT_EQ(with("train.precision=fp16").train.precision, train::Precision::kFp16);
  EXPECT_EQ(with("ddp.reduce_dtype=bf16").ddp.reduce_dtype, ddp::ReduceDtype::kBf16);
  EXPECT_EQ(with("log.progress=lines").log.progress, train::ProgressSetting::kLines);
  EXPECT_EQ(with("log.progress=off").log.progress, train::ProgressSetting::kOff);
  EXPECT_EQ(with("model.cell=transformer").model.cell, models::SequenceCell::kTransformer);
  EXPECT_EQ(with("model.loss=mse").model.loss, models::CnnLoss::kMse);
  EXPECT_EQ(with("data.packing=documents").data.packing, data::Packing::kDocuments);
  EXPECT_EQ(with("data.packing=none").data.packing, data::Packing::kNone);
  EXPECT_EQ(with("memory.fallback=[uncache_embeddings, halve_micro_batch]").memory.fallback,
            (std::vector<memory::Rung>{memory::Rung::kUncacheEmbeddings,
                                       memory::Rung::kHalveMicroBatch}));
  EXPECT_EQ(
      with("memory.fallback=[shard_optimizer, halve_micro_batch]").memory.fallback,
      (std::vector<memory::Rung>{memory::Rung::kShardOptimizer, memory::Rung::kHalveMicroBatch}));
  EXPECT_TRUE(with("memory.fallback=[]").memory.fallback.empty());
}

TEST(ConfigChoices, DefaultsComeFromTheSchema) {
  const Config c = parse_config(kMinimal, "run.yaml");
  EXPECT_EQ(c.train.precision, train::Precision::kFp32);
  EXPECT_EQ(c.train.tf32, train::Switch::kAuto);
  EXPECT_EQ(c.train.channels_last, train::Switch::kAuto);
  EXPECT_EQ(c.ddp.reduce_dtype, ddp::ReduceDtype::kFp32);
  EXPECT_EQ(c.log.progress, train::ProgressSetting::kAuto);
  EXPECT_EQ(c.model.cell, models::SequenceCell::kLstm);
  EXPECT_EQ(c.model.loss, models::CnnLoss::kL1);
  EXPECT_EQ(c.data.packing, data::Packing::kAuto);
  EXPECT_EQ(c.memory.fallback, (std::vector<memory::Rung>{memory::Rung::kCheckpointActivations,
                                                          memory::Rung::kHalveMicroBatch,
                                                          memory::Rung::kUncacheEmbeddings}));
  // The keys whose option structs used to repeat a default.
  EXPECT_EQ(c.data.text_len, 64);
  EXPECT_EQ(c.data.negatives, 8);
  EXPECT_EQ(c.data.scale, 1);
  EXPECT_EQ(c.memory.min_micro_batch, 1);
  const auto loader = c.trainer_options().loader;
  EXPECT_EQ(loader.workers, 2);
  EXPECT_EQ(loader.prefetch, 2);
  EXPECT_EQ(loader.read_delay_ms, 0);
  EXPECT_FALSE(loader.pin_memory);
}

TEST(ConfigChoices, AnUnknownNameNamesTheKeyAndTheChoices) {
  EXPECT_EQ(
      config_error(kMinimal, {"train.channels_last=yes"}),
      "--set train.channels_last=yes: train.channels_last: 'yes' is not one of: auto, on, off");
  EXPECT_EQ(config_error(kMinimal, {"ddp.reduce_dtype=fp16"}),
            "--set ddp.reduce_dtype=fp16: ddp.reduce_dtype: 'fp16' is not one of: fp32, bf16");
  EXPECT_EQ(config_error("model:\n  name: mlp\n  cell: gru\ntrain:\n  global_batch_size: 8\n"),
            "bad.yaml:3: model.cell: 'gru' is not one of: lstm, transformer");
  EXPECT_EQ(
      config_error(kMinimal, {"memory.fallback=[halve_micro_batch, shrink]"}),
      "--set memory.fallback=[halve_micro_batch, shrink]: memory.fallback: 'shrink' is not one "
      "of: checkpoint_activations, halve_micro_batch, shard_optimizer, uncache_embeddings, "
      "shard_parameters");
  EXPECT_EQ(config_error(kMinimal, {"memory.fallback=halve_micro_batch"}),
            "--set memory.fallback=halve_micro_batch: memory.fallback: expected a list like "
            "[checkpoint_activations], got 'halve_micro_batch'");
  EXPECT_EQ(config_error(kMinimal, {"log.progress=[bar]"}),
            "--set log.progress=[bar]: log.progress: expected one of the choices, got a list");
}

}  // namespace TRAINER_UNITY_ID
