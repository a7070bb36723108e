// Config loading: defaults, files, overrides, the YAML dump and the reference table.

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
  const Config config = config::load_config(good.path(), {"train.lr=0.5"});
  EXPECT_EQ(config.source, good.path());
  EXPECT_EQ(config.train.steps, 40);
  EXPECT_DOUBLE_EQ(config.train.lr, 0.5);

  TempFile bad(kMinimal + "  steps: -3\n");
  try {
    config::load_config(bad.path());
    FAIL() << "load_config accepted steps: -3";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              bad.path() + ":5: train.steps: -3 is out of range: must be >= 1");
  }
}

#ifdef TRAINER_SOURCE_DIR
TEST(Config, ShippedQuickstartConfigIsValid) {
  const Config config =
      config::load_config(std::string(TRAINER_SOURCE_DIR) + "/configs/quickstart.yaml");
  EXPECT_EQ(config.model.name, "gpt");
  EXPECT_EQ(config.data.tokenizer, "bytes");
  EXPECT_GE(config.train.global_batch_size, 1);
  const Config mlp = config::load_config(std::string(TRAINER_SOURCE_DIR) + "/configs/mlp.yaml");
  EXPECT_EQ(mlp.model.name, "mlp");
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
  EXPECT_EQ(
      parse_config(kMinimal + "  micro_batch_size: auto\n", "run.yaml").train.micro_batch_size, 0);
  EXPECT_EQ(parse_config(kMinimal + "  micro_batch_size: 8\n", "run.yaml").train.micro_batch_size,
            8);
  EXPECT_EQ(parse_config(kMinimal + "  micro_batch_size: 8\n", "run.yaml",
                         {"train.micro_batch_size=auto"})
                .train.micro_batch_size,
            0);
}

TEST(Config, WarmupBelowStepsIsAccepted) {
  const Config c = parse_config(kMinimal + "  steps: 11\n", "run.yaml");
  EXPECT_EQ(c.train.steps, 11);
  EXPECT_EQ(c.train.warmup_steps, 10);
}

TEST(Config, OverridesWinOverTheFile) {
  const Config c = parse_config(
      kMinimal + "  steps: 50\n  lr: 0.01\n", "run.yaml",
      {"train.steps=200", "train.lr=0.1", "train.lr=0.2", "model.depth=4", "checkpoint.dir=out/x"});
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.2);  // the last --set of a key wins
  EXPECT_EQ(c.model.depth, 4);
  EXPECT_EQ(c.checkpoint.dir, "out/x");
  EXPECT_EQ(c.train.global_batch_size, 64);
}

// The sequence model's own defaults for the keys it shares with gpt come from the schema; a key
// the file or an override sets wins, and gpt keeps "0: the preset's".
TEST(Config, ModelDefaultsDependOnTheModel) {
  const std::vector<std::string> train = {"train.global_batch_size=8"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), train.begin(), train.end());
    return parse_config("", "--set", sets);
  };
  const Config sequence = with({"model.name=sequence"});
  EXPECT_EQ(sequence.model.num_layers, 2);
  EXPECT_EQ(sequence.model.heads, 4);
  EXPECT_EQ(sequence.model.d_model, 64);
  const Config gpt = with({"model.name=gpt"});
  EXPECT_EQ(gpt.model.num_layers, 0);
  EXPECT_EQ(gpt.model.d_model, 0);
  const Config set = with({"model.name=sequence", "model.num_layers=3"});
  EXPECT_EQ(set.model.num_layers, 3);
  EXPECT_EQ(set.model.heads, 4);
}

TEST(Config, OverridesAloneCanSupplyRequiredKeys) {
  const Config c = parse_config("", "--set", {"model.name=mlp", "train.global_batch_size=12"});
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(c.train.global_batch_size, 12);
}

TEST(Config, OverrideWithAnEmptyValueClearsAString) {
  const Config c =
      parse_config(kMinimal + "checkpoint:\n  dir: runs/a\n", "run.yaml", {"checkpoint.dir="});
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
  const Config original =
      parse_config(kMinimal + "  micro_batch_size: 5\n  steps: 77\n  lr: 0.0003\n  eps: 1.5e-9\n"
                              "  seed: 9223372036854775807\n  threads: 3\n"
                              "  skip_spikes: {loss_z: 4.5, window: 20}\n"
                              "data:\n  label_noise: 0.1\n  num_samples: 1099511627776\n"
                              "ddp:\n  backend: mpi\n  timeout_s: 12.75\n"
                              "checkpoint:\n  dir: /tmp/ckpt/run-1\n  every: 3\n"
                              "log:\n  level: warn\n",
                   "run.yaml");
  const std::string dumped = config::config_to_yaml(original);
  const Config again = parse_config(dumped, "dump.yaml");
  expect_same_config(original, again);
  EXPECT_EQ(config::config_to_yaml(again), dumped);
  EXPECT_EQ(again.train.seed, 9223372036854775807ull);
  // A key left out of train.skip_spikes takes its default.
  EXPECT_EQ(again.train.skip_spikes.loss_z, 4.5);
  EXPECT_EQ(again.train.skip_spikes.grad_norm_z, 6.0);
  EXPECT_EQ(again.train.skip_spikes.window, 20);
  EXPECT_FALSE(parse_config(kMinimal, "run.yaml").train.skip_spikes.enabled());
}

TEST(Config, YamlDumpOfDefaultsRoundTrips) {
  const Config original = parse_config(kMinimal, "run.yaml");
  const std::string dumped = config::config_to_yaml(original);
  EXPECT_THAT(dumped, StartsWith("model:\n  name: mlp\n  hidden_dim: 256\n  depth: 2\n"));
  EXPECT_THAT(dumped, HasSubstr("\n  micro_batch_size: auto\n"));
  EXPECT_THAT(dumped, HasSubstr("\ncheckpoint:\n  dir: \"\"\n  every: 0\n"));
  expect_same_config(original, parse_config(dumped, "dump.yaml"));
}

// A string value that means something else to YAML when written bare must survive the dump.
TEST(Config, YamlDumpRoundTripsStringsThatNeedQuoting) {
  for (const std::string dir : {"runs/exp 1 #2", "a: b", "~", "[x]"}) {
    const Config original = parse_config(kMinimal, "run.yaml", {"checkpoint.dir='" + dir + "'"});
    ASSERT_EQ(original.checkpoint.dir, dir);
    const std::string dumped = config::config_to_yaml(original);
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

const std::vector<std::string> kEveryKey = {"model.name",
                                            "model.hidden_dim",
                                            "model.depth",
                                            "model.embedding_dim",
                                            "model.encoder_dim",
                                            "model.encoder_layers",
                                            "model.encoder_heads",
                                            "model.text_len",
                                            "model.encoder_weights",
                                            "model.preset",
                                            "model.num_layers",
                                            "model.heads",
                                            "model.d_model",
                                            "model.context",
                                            "model.dropout",
                                            "model.init_from",
                                            "model.checkpoint_activations",
                                            "model.kv_heads",
                                            "model.head_dim",
                                            "model.intermediate_size",
                                            "model.rms_norm_eps",
                                            "model.rope_theta",
                                            "model.rope_scaling",
                                            "model.rope_factor",
                                            "model.rope_low_freq_factor",
                                            "model.rope_high_freq_factor",
                                            "model.rope_original_context",
                                            "model.attention_bias",
                                            "model.mlp_bias",
                                            "model.tie_embeddings",
                                            "model.sliding_window",
                                            "model.lora_rank",
                                            "model.lora_alpha",
                                            "model.lora_rslora",
                                            "model.lora_dropout",
                                            "model.lora_targets",
                                            "model.lora_init_from",
                                            "model.cell",
                                            "model.base_channels",
                                            "model.num_blocks",
                                            "model.loss",
                                            "data.dataset",
                                            "data.path",
                                            "data.val_path",
                                            "data.mixture",
                                            "data.context",
                                            "data.vocab_size",
                                            "data.packing",
                                            "data.tokenizer",
                                            "data.features",
                                            "data.targets",
                                            "data.window",
                                            "data.horizon",
                                            "data.val_fraction",
                                            "data.patch_size",
                                            "data.scale",
                                            "data.noise_std",
                                            "data.crops_per_image",
                                            "data.workers",
                                            "data.prefetch",
                                            "data.inject_read_delay_ms",
                                            "data.text_len",
                                            "data.negatives",
                                            "data.num_samples",
                                            "data.input_dim",
                                            "data.num_classes",
                                            "data.teacher_hidden",
                                            "data.label_noise",
                                            "data.seed",
                                            "train.device",
                                            "train.global_batch_size",
                                            "train.micro_batch_size",
                                            "train.steps",
                                            "train.lr",
                                            "train.min_lr_ratio",
                                            "train.warmup_steps",
                                            "train.weight_decay",
                                            "train.beta1",
                                            "train.beta2",
                                            "train.eps",
                                            "train.grad_clip",
                                            "train.seed",
                                            "train.threads",
                                            "train.eval_every",
                                            "train.schedule",
                                            "train.decay_fraction",
                                            "train.decay_shape",
                                            "train.optimizer",
                                            "train.muon_lr",
                                            "train.muon_weight_decay",
                                            "train.muon_momentum",
                                            "train.muon_nesterov",
                                            "train.muon_ns_steps",
                                            "train.muon_adjust_lr",
                                            "train.muon_ns_dtype",
                                            "train.objective",
                                            "train.dpo_beta",
                                            "train.dpo_label_smoothing",
                                            "train.simpo_beta",
                                            "train.simpo_gamma",
                                            "train.precision",
                                            "train.loss_scale",
                                            "train.loss_scale_growth",
                                            "train.loss_scale_backoff",
                                            "train.loss_scale_interval",
                                            "train.max_skipped_steps",
                                            "train.inject_nonfinite",
                                            "train.skip_spikes",
                                            "train.inject_spike",
                                            "train.tf32",
                                            "train.cudnn_benchmark",
                                            "train.channels_last",
                                            "train.cuda_graphs",
                                            "train.peak_tflops",
                                            "train.sample_every",
                                            "train.sample_prompt",
                                            "train.sample_tokens",
                                            "train.sample_temperature",
                                            "train.sample_top_k",
                                            "train.eval_samples",
                                            "eval.tasks",
                                            "ddp.backend",
                                            "ddp.timeout_s",
                                            "ddp.first_bucket_mb",
                                            "ddp.bucket_mb",
                                            "ddp.find_unused_parameters",
                                            "ddp.reduce_dtype",
                                            "ddp.shard",
                                            "ddp.shard_group",
                                            "ddp.reshard_after_forward",
                                            "ddp.prefetch_units",
                                            "ddp.mpi_progress",
                                            "ddp.mpi_poll_us",
                                            "memory.fallback",
                                            "memory.min_micro_batch",
                                            "memory.fraction",
                                            "memory.cpu_budget_mb",
                                            "memory.inject_oom",
                                            "memory.check_every",
                                            "memory.target_fraction",
                                            "memory.high_watermark",
                                            "checkpoint.dir",
                                            "checkpoint.every",
                                            "checkpoint.keep_last",
                                            "checkpoint.resume",
                                            "checkpoint.format",
                                            "checkpoint.async",
                                            "checkpoint.max_failed_writes",
                                            "log.level",
                                            "log.every",
                                            "log.metrics",
                                            "log.progress",
                                            "log.tensorboard",
                                            "log.profile",
                                            "log.profile_from",
                                            "log.profile_steps"};

TEST(Config, SchemaDeclaresExactlyTheKnownKeys) {
  std::vector<std::string> paths;
  for (const auto& k : config::schema::keys()) paths.push_back(k.path);
  EXPECT_EQ(paths, kEveryKey);
}

TEST(Config, ReferenceListsEveryKey) {
  const std::string reference = config::config_reference();
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
  auto line_of = [&](const std::string& key) {
    for (const auto& l : lines) {
      if (l.rfind(key + " ", 0) == 0) return l;
    }
    ADD_FAILURE() << key << " not in the reference";
    return std::string();
  };
  EXPECT_THAT(line_of("train.global_batch_size"), HasSubstr("required"));
  EXPECT_THAT(line_of("train.global_batch_size"), HasSubstr("1 .. 2147483648"));
  EXPECT_THAT(line_of("train.lr"), HasSubstr("0.001"));
  EXPECT_THAT(line_of("train.lr"), HasSubstr("(0, 10]"));
  EXPECT_THAT(line_of("train.micro_batch_size"), HasSubstr(">= 1 or auto"));
  EXPECT_THAT(line_of("train.device"), HasSubstr("auto | cpu | cuda"));
  EXPECT_THAT(line_of("memory.fallback"),
              HasSubstr("[checkpoint_activations, halve_micro_batch, uncache_embeddings]"));
}

}  // namespace TRAINER_UNITY_ID
