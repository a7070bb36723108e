// Config loading: every bad input is a ConfigError naming the key and file:line (or the --set that
// caused it); defaults, overrides, the YAML dump and the reference table.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <unistd.h>

#include "launcher/config.h"
#include "launcher/config_schema.h"

namespace {

using launcher::Config;
using launcher::ConfigError;
using launcher::parse_config;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The smallest valid file: lines 1-4. Tests append lines from 5 on.
const std::string kMinimal =
    "model:\n"                     // 1
    "  name: mlp\n"                // 2
    "train:\n"                     // 3
    "  global_batch_size: 64\n";   // 4

// The message of the ConfigError parse_config throws for `yaml`; "" and a failure when it throws
// none (or throws something else).
std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "bad.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << " instead of a ConfigError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "parse_config accepted:\n" << yaml;
  return "";
}

// `message` reports exactly one problem, found at `location`, and contains every fragment.
void expect_one_problem(const std::string& message, const std::string& location,
                        const std::vector<std::string>& fragments) {
  EXPECT_THAT(message, StartsWith(location + ": "));
  EXPECT_THAT(message, Not(HasSubstr("problems in the configuration")));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const auto& f : fragments) EXPECT_THAT(message, HasSubstr(f));
}

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
                      "sections are: model, data, train, ddp, memory, checkpoint, log"});
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
  const std::string message = config_error(
      "model:\n  name: mlp\ntrain:\n  global_batch_size: lots\n");
  expect_one_problem(message, "bad.yaml:4",
                     {"train.global_batch_size: expected an integer, got 'lots'"});
}

// ---- ranges ----

TEST(ConfigErrors, IntegerAboveItsRange) {
  const std::string message = config_error(
      "model:\n  name: mlp\n  depth: 300\ntrain:\n  global_batch_size: 64\n");
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
  const std::string message = config_error(
      "model:\n  name: nope\ntrain:\n  global_batch_size: 64\n");
  EXPECT_THAT(message, HasSubstr("bad.yaml:2: model.name: 'nope' is not one of: mlp"));
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
  EXPECT_EQ(message,
            "bad.yaml:5: train.global_batch_size: given twice (first at bad.yaml:4)");
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
  EXPECT_EQ(message,
            "bad.yaml:6: train.warmup_steps = 10 must be smaller than train.steps = 10");
}

TEST(ConfigErrors, DefaultWarmupNotBelowStepsIsReportedAtSteps) {
  const std::string message = config_error(kMinimal + "  steps: 5\n");
  EXPECT_EQ(message,
            "bad.yaml:5: train.warmup_steps (default) = 10 must be smaller than train.steps = 5");
}

TEST(ConfigErrors, WarmupRelationBrokenByAnOverride) {
  const std::string message = config_error(kMinimal, {"train.steps=8"});
  EXPECT_EQ(message,
            "--set train.steps=8: train.warmup_steps (default) = 10 must be smaller than "
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
  EXPECT_EQ(message, "--set train.stpes=5: unknown key 'train.stpes' (did you mean 'train.steps'?)");
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
  EXPECT_EQ(message,
            "bad.yaml:5: train.micro_batch_size: expected a positive integer or 'auto', got 'half'");
}

// ---- several at once ----

TEST(ConfigErrors, SeveralProblemsAreListedTogetherInOrder) {
  const std::string message = config_error(
      kMinimal + "  steps: ten\n  lr: 0\n  devcie: cpu\n", {"log.every=0"});
  EXPECT_EQ(message,
            "4 problems in the configuration:\n"
            "bad.yaml:5: train.steps: expected an integer, got 'ten'\n"
            "bad.yaml:6: train.lr: 0 is out of range: must be in (0, 10]\n"
            "bad.yaml:7: unknown key 'train.devcie' (did you mean 'train.device'?)\n"
            "--set log.every=0: log.every: 0 is out of range: must be >= 1");
}

// ---- load_config ----

TEST(ConfigErrors, LoadConfigOfAMissingFileNamesThePath) {
  const std::string path = "/nonexistent-dir/run.yaml";
  try {
    launcher::load_config(path);
    FAIL() << "load_config accepted a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": cannot read the config file: No such file or directory");
  }
}

class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) +
               ".yaml")) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(Config, LoadConfigReadsTheFileAndNamesItInErrors) {
  TempFile good(kMinimal + "  steps: 40\n");
  const Config config = launcher::load_config(good.path(), {"train.lr=0.5"});
  EXPECT_EQ(config.source, good.path());
  EXPECT_EQ(config.train.steps, 40);
  EXPECT_DOUBLE_EQ(config.train.lr, 0.5);

  TempFile bad(kMinimal + "  steps: -3\n");
  try {
    launcher::load_config(bad.path());
    FAIL() << "load_config accepted steps: -3";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              bad.path() + ":5: train.steps: -3 is out of range: must be >= 1");
  }
}

#ifdef TRAINER_SOURCE_DIR
TEST(Config, ShippedQuickstartConfigIsValid) {
  const Config config = launcher::load_config(std::string(TRAINER_SOURCE_DIR) + "/configs/quickstart.yaml");
  EXPECT_EQ(config.model.name, "mlp");
  EXPECT_GE(config.train.global_batch_size, 1);
}
#endif

// ---- valid configurations ----

TEST(Config, DefaultsAreApplied) {
  const Config c = parse_config(kMinimal, "run.yaml");
  EXPECT_EQ(c.source, "run.yaml");
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(c.model.hidden_dim, 256);
  EXPECT_EQ(c.model.depth, 2);
  EXPECT_EQ(c.data.dataset, "synthetic");
  EXPECT_EQ(c.data.num_samples, 16384);
  EXPECT_EQ(c.data.input_dim, 32);
  EXPECT_EQ(c.data.num_classes, 10);
  EXPECT_EQ(c.data.teacher_hidden, 64);
  EXPECT_EQ(c.data.label_noise, 0.0);
  EXPECT_EQ(c.data.seed, 1234u);
  EXPECT_EQ(c.train.device, "auto");
  EXPECT_EQ(c.train.global_batch_size, 64);
  EXPECT_EQ(c.train.micro_batch_size, 0);
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.001);
  EXPECT_DOUBLE_EQ(c.train.min_lr_ratio, 0.1);
  EXPECT_EQ(c.train.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.train.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_EQ(c.train.threads, 0);
  EXPECT_EQ(c.ddp.backend, "auto");
  EXPECT_DOUBLE_EQ(c.ddp.timeout_s, 600.0);
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(c.checkpoint.every, 0);
  EXPECT_EQ(c.log.level, "info");
  EXPECT_EQ(c.log.every, 10);
}

TEST(Config, FileValuesAreRead) {
  const Config c = parse_config(
      "model:\n  name: mlp\n  hidden_dim: 128\n  depth: 0\n"
      "data:\n  num_samples: 1000\n  label_noise: 0.25\n  seed: 7\n"
      "train:\n  device: cpu\n  global_batch_size: 96\n  micro_batch_size: 16\n  steps: 30\n"
      "  lr: 0.02\n  warmup_steps: 0\n  eps: 1e-6\n  beta1: 0\n"
      "ddp:\n  backend: mpi\n  timeout_s: 0.5\n"
      "checkpoint:\n  dir: runs/a\n  every: 5\n"
      "log:\n  level: debug\n",
      "run.yaml");
  EXPECT_EQ(c.model.hidden_dim, 128);
  EXPECT_EQ(c.model.depth, 0);
  EXPECT_EQ(c.data.num_samples, 1000);
  EXPECT_DOUBLE_EQ(c.data.label_noise, 0.25);
  EXPECT_EQ(c.data.seed, 7u);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.train.global_batch_size, 96);
  EXPECT_EQ(c.train.micro_batch_size, 16);
  EXPECT_EQ(c.train.steps, 30);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.02);
  EXPECT_EQ(c.train.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(c.train.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.train.beta1, 0.0);
  EXPECT_EQ(c.ddp.backend, "mpi");
  EXPECT_DOUBLE_EQ(c.ddp.timeout_s, 0.5);
  EXPECT_EQ(c.checkpoint.dir, "runs/a");
  EXPECT_EQ(c.checkpoint.every, 5);
  EXPECT_EQ(c.log.level, "debug");
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.log.every, 10);
  EXPECT_EQ(c.train.seed, 42u);
}

TEST(Config, MicroBatchSizeAutoIsZero) {
  EXPECT_EQ(parse_config(kMinimal + "  micro_batch_size: auto\n", "run.yaml").train.micro_batch_size, 0);
  EXPECT_EQ(parse_config(kMinimal + "  micro_batch_size: 8\n", "run.yaml").train.micro_batch_size, 8);
  EXPECT_EQ(parse_config(kMinimal + "  micro_batch_size: 8\n", "run.yaml", {"train.micro_batch_size=auto"})
                .train.micro_batch_size,
            0);
}

TEST(Config, WarmupBelowStepsIsAccepted) {
  const Config c = parse_config(kMinimal + "  steps: 11\n", "run.yaml");
  EXPECT_EQ(c.train.steps, 11);
  EXPECT_EQ(c.train.warmup_steps, 10);
}

TEST(Config, OverridesWinOverTheFile) {
  const Config c = parse_config(kMinimal + "  steps: 50\n  lr: 0.01\n", "run.yaml",
                                {"train.steps=200", "train.lr=0.1", "train.lr=0.2",
                                 "model.depth=4", "checkpoint.dir=out/x"});
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.2);  // the last --set of a key wins
  EXPECT_EQ(c.model.depth, 4);
  EXPECT_EQ(c.checkpoint.dir, "out/x");
  EXPECT_EQ(c.train.global_batch_size, 64);
}

TEST(Config, OverridesAloneCanSupplyRequiredKeys) {
  const Config c = parse_config("", "--set", {"model.name=mlp", "train.global_batch_size=12"});
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(c.train.global_batch_size, 12);
}

TEST(Config, OverrideWithAnEmptyValueClearsAString) {
  const Config c = parse_config(kMinimal + "checkpoint:\n  dir: runs/a\n", "run.yaml",
                                {"checkpoint.dir="});
  EXPECT_EQ(c.checkpoint.dir, "");
}

// Every field of two configs is equal.
void expect_same_config(const Config& a, const Config& b) {
  EXPECT_EQ(a.model.name, b.model.name);
  EXPECT_EQ(a.model.hidden_dim, b.model.hidden_dim);
  EXPECT_EQ(a.model.depth, b.model.depth);
  EXPECT_EQ(a.data.dataset, b.data.dataset);
  EXPECT_EQ(a.data.num_samples, b.data.num_samples);
  EXPECT_EQ(a.data.input_dim, b.data.input_dim);
  EXPECT_EQ(a.data.num_classes, b.data.num_classes);
  EXPECT_EQ(a.data.teacher_hidden, b.data.teacher_hidden);
  EXPECT_EQ(a.data.label_noise, b.data.label_noise);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.train.device, b.train.device);
  EXPECT_EQ(a.train.global_batch_size, b.train.global_batch_size);
  EXPECT_EQ(a.train.micro_batch_size, b.train.micro_batch_size);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.lr, b.train.lr);  // exact: the dump must not lose digits
  EXPECT_EQ(a.train.min_lr_ratio, b.train.min_lr_ratio);
  EXPECT_EQ(a.train.warmup_steps, b.train.warmup_steps);
  EXPECT_EQ(a.train.weight_decay, b.train.weight_decay);
  EXPECT_EQ(a.train.beta1, b.train.beta1);
  EXPECT_EQ(a.train.beta2, b.train.beta2);
  EXPECT_EQ(a.train.eps, b.train.eps);
  EXPECT_EQ(a.train.grad_clip, b.train.grad_clip);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.threads, b.train.threads);
  EXPECT_EQ(a.ddp.backend, b.ddp.backend);
  EXPECT_EQ(a.ddp.timeout_s, b.ddp.timeout_s);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.log.level, b.log.level);
  EXPECT_EQ(a.log.every, b.log.every);
}

TEST(Config, YamlDumpRoundTrips) {
  const Config original = parse_config(
      kMinimal + "  micro_batch_size: 5\n  steps: 77\n  lr: 0.0003\n  eps: 1.5e-9\n"
                 "  seed: 9223372036854775807\n  threads: 3\n"
                 "data:\n  label_noise: 0.1\n  num_samples: 1099511627776\n"
                 "ddp:\n  backend: mpi\n  timeout_s: 12.75\n"
                 "checkpoint:\n  dir: /tmp/ckpt/run-1\n  every: 3\n"
                 "log:\n  level: warn\n",
      "run.yaml");
  const std::string dumped = launcher::config_to_yaml(original);
  const Config again = parse_config(dumped, "dump.yaml");
  expect_same_config(original, again);
  EXPECT_EQ(launcher::config_to_yaml(again), dumped);
  EXPECT_EQ(again.train.seed, 9223372036854775807ull);
}

TEST(Config, YamlDumpOfDefaultsRoundTrips) {
  const Config original = parse_config(kMinimal, "run.yaml");
  const std::string dumped = launcher::config_to_yaml(original);
  EXPECT_THAT(dumped, StartsWith("model:\n  name: mlp\n  hidden_dim: 256\n  depth: 2\n\ndata:\n"));
  EXPECT_THAT(dumped, HasSubstr("\n  micro_batch_size: auto\n"));
  EXPECT_THAT(dumped, HasSubstr("\ncheckpoint:\n  dir: \"\"\n  every: 0\n"));
  expect_same_config(original, parse_config(dumped, "dump.yaml"));
}

// A string value that means something else to YAML when written bare must survive the dump.
TEST(Config, YamlDumpRoundTripsStringsThatNeedQuoting) {
  for (const std::string dir : {"runs/exp 1 #2", "a: b", "~", "[x]"}) {
    const Config original = parse_config(kMinimal, "run.yaml", {"checkpoint.dir='" + dir + "'"});
    ASSERT_EQ(original.checkpoint.dir, dir);
    const std::string dumped = launcher::config_to_yaml(original);
    Config again;
    try {
      again = parse_config(dumped, "dump.yaml");
    } catch (const ConfigError& e) {
      ADD_FAILURE() << "the dump of checkpoint.dir '" << dir << "' does not parse: " << e.what();
      continue;
    }
    EXPECT_EQ(again.checkpoint.dir, dir);
  }
}

const std::vector<std::string> kEveryKey = {
    "model.name", "model.hidden_dim", "model.depth",
    "data.dataset", "data.num_samples", "data.input_dim", "data.num_classes",
    "data.teacher_hidden", "data.label_noise", "data.seed",
    "train.device", "train.global_batch_size", "train.micro_batch_size", "train.steps",
    "train.lr", "train.min_lr_ratio", "train.warmup_steps", "train.weight_decay", "train.beta1",
    "train.beta2", "train.eps", "train.grad_clip", "train.seed", "train.threads",
    "ddp.backend", "ddp.timeout_s", "ddp.first_bucket_mb", "ddp.bucket_mb",
    "ddp.find_unused_parameters",
    "memory.fallback", "memory.min_micro_batch", "memory.fraction", "memory.cpu_budget_mb",
    "memory.inject_oom",
    "checkpoint.dir", "checkpoint.every",
    "log.level", "log.every"};

TEST(Config, SchemaDeclaresExactlyTheKnownKeys) {
  std::vector<std::string> paths;
  for (const auto& k : launcher::schema::keys()) paths.push_back(k.path);
  EXPECT_EQ(paths, kEveryKey);
}

TEST(Config, ReferenceListsEveryKey) {
  const std::string reference = launcher::config_reference();
  std::vector<std::string> lines;
  for (size_t start = 0; start < reference.size();) {
    const size_t end = reference.find('\n', start);
    lines.push_back(reference.substr(start, end - start));
    start = end == std::string::npos ? reference.size() : end + 1;
  }
  ASSERT_EQ(lines.size(), kEveryKey.size() + 1);
  EXPECT_THAT(lines[0], StartsWith("key"));
  EXPECT_THAT(lines[0], HasSubstr("description"));
  for (size_t i = 0; i < kEveryKey.size(); ++i) {
    EXPECT_THAT(lines[i + 1], StartsWith(kEveryKey[i] + " ")) << "line " << i + 1;
  }
  // Required keys say so; others show their default and range.
  EXPECT_THAT(lines[12], HasSubstr("required"));  // train.global_batch_size
  EXPECT_THAT(lines[12], HasSubstr("1 .. 2147483648"));
  EXPECT_THAT(lines[15], HasSubstr("0.001"));      // train.lr
  EXPECT_THAT(lines[15], HasSubstr("(0, 10]"));
  EXPECT_THAT(lines[13], HasSubstr(">= 1 or auto"));  // train.micro_batch_size
  EXPECT_THAT(lines[11], HasSubstr("auto | cpu | cuda"));  // train.device
}

}  // namespace
