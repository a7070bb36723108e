// ddp.shard: parameters with the model built without storage (models/deferred_init.h; issue 39),
// under mpirun -np 2 and 3:
// - DeferredBuild: gpt and llama (tied, untied; with LoRA adapters, whose frozen base is sharded
//   too) built without storage and filled unit by unit on every rank start from bitwise the
//   parameters (and frozen base) of the same model built whole and broadcast,
//   and stay bitwise equal through the steps; the start-up's allocations peak at least half a
//   model lower; model.init_from read by ranges equals the whole load while each rank reads about
//   its share of the files; a sharded checkpoint resumes reading each rank's ranges only, and the
//   run continues bitwise as the uninterrupted one; a single-file checkpoint's gather leaves
//   LoRA's frozen base sharded; model.lora_init_from's adapters are read into each rank's blocks.
// - ShardedOom: an out-of-memory error inside a parameters step (forward or backward, one or
//   several micro-batches, any rank) takes the next rung on every rank and ends with the
//   parameters of a run that took that rung from the start (LoRA's adapters too, in fp32 and
//   bf16, their frozen base bitwise as it started); thirty seeded random injections all complete.
// - LockstepUnits: evaluation (slices of different lengths per rank) and rank 0's generation under
//   parameters give what the unsharded run gives, and evaluation gathers one unit at a time.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "checkpoint/checkpointer.h"
#include "checkpoint/read.h"
#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "memory/allocator_guard.h"
#include "models/deferred_init.h"
#include "models/lm/causal_lm.h"
#include "models/lm/generate.h"
#include "models/lm/lora.h"
#include "models/registry.h"
#include "train/choice_evaluation.h"
#include "train/evaluation.h"
#include "train/loop.h"

namespace TRAINER_UNITY_ID {

using trainer_test::make_cpu_run;
using trainer_test::relative_error;
using trainer_test::snapshot;

// Token shards with a validation shard, for the life of the process.
const std::string& shard_dir() {
  static const test::TempDir dir;
  static const bool written = [] {
    for (const char* name : {"train_000.bin", "val_000.bin"}) {
      const at::Tensor t = (at::arange(5000, at::kLong) * 7919 % 97).to(at::kShort);
      FILE* f = std::fopen((dir.path() + "/" + name).c_str(), "wb");
      std::fwrite(t.data_ptr(), 2, 5000, f);
      std::fclose(f);
    }
    return true;
  }();
  (void)written;
  return dir.path();
}

// A language model on the shards above (`model` the YAML mapping's inside), one unit per block.
std::string lm_yaml(const std::string& model, const std::string& extra = "") {
  return fmt::format(
      "model: {{{}}}\n"
      "data: {{dataset: tokens, path: {}, context: 16, vocab_size: 100}}\n"
      "train: {{device: cpu, global_batch_size: 7, micro_batch_size: 2, steps: 4, lr: 0.003, "
      "warmup_steps: 1, seed: 11, grad_clip: 1.0, eval_samples: 7}}\n"
      "ddp: {{shard: parameters}}\n"
      "memory: {{check_every: 0}}\n{}",
      model, shard_dir(), extra);
}

const char* kGpt = "name: gpt, preset: tiny, num_layers: 3, d_model: 32, heads: 4";
std::string llama(bool tied) {
  return fmt::format("name: llama, preset: llama-tiny, num_layers: 3, d_model: 36, heads: 6, "
                     "kv_heads: 2, intermediate_size: 40, tie_embeddings: {}",
                     tied);
}

// The parameters, gathered (collective).
std::vector<at::Tensor> gathered(trainer_test::CpuRun& run) {
  const auto pinned = trainer_test::pin_parameters(*run.trainer);
  return snapshot(*run.model);
}

// The buffers (LoRA's frozen base), gathered (collective).
std::vector<at::Tensor> gathered_buffers(trainer_test::CpuRun& run) {
  const auto pinned = trainer_test::pin_parameters(*run.trainer);
  std::vector<at::Tensor> out;
  for (const auto& b : run.model->buffers()) out.push_back(b.detach().clone());
  return out;
}

// LoRA on llama(false): q, v and down_proj adapted; the base frozen.
const char* kLora = ", lora_rank: 4, lora_alpha: 8, lora_targets: [q_proj, v_proj, down_proj]";

bool bitwise(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

// model.lora_init_from's value in a test parameter: the adapter peft_dir() writes.
constexpr const char* kPeftDir = "PEFT_DIR";

// A PEFT adapter for llama(false) + kLora, every tensor random (B too, which PEFT and the trainer
// start at zero): written once per process by --export-peft's function.
const std::string& peft_dir() {
  static const test::TempDir dir;
  static const bool written = [] {
    const config::Config c = config::parse_config(lm_yaml(llama(false) + kLora), "peft.yaml");
    core::Shape shape;
    shape.vocab_size = c.data.vocab_size;
    shape.context = c.data.context;
    const auto model = std::dynamic_pointer_cast<models::CausalLm>(
        models::create_language_model(c.model, shape, "the test's adapter"));
    at::manual_seed(23);
    at::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.uniform_(-0.2, 0.2);
    models::export_peft(*model, dir.path(), "");
    return true;
  }();
  (void)written;
  return dir.path();
}

// `yaml` with kPeftDir replaced by peft_dir().
std::string with_peft_dir(std::string yaml) {
  if (const size_t at = yaml.find(kPeftDir); at != std::string::npos) {
    yaml.replace(at, std::strlen(kPeftDir), peft_dir());
  }
  return yaml;
}

class DeferredBuild : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<ddp::Communicator> comm_ =
      trainer_test::runtime().world(std::chrono::seconds(60));
};

TEST_P(DeferredBuild, StartsAndTrainsBitwiseAsTheModelBuiltWhole) {
  const std::string yaml = with_peft_dir(lm_yaml(GetParam()));
  auto whole = make_cpu_run(*comm_, yaml, "whole.yaml");
  auto deferred = make_cpu_run(*comm_, yaml, "deferred.yaml", {}, /*deferred=*/true);
  ASSERT_NE(deferred.model->deferred_init(), nullptr);
  EXPECT_TRUE(bitwise(gathered(whole), gathered(deferred)));
  if (yaml.find("lora_init_from") != std::string::npos) {  // B read from the file, not zero
    for (const at::Tensor& p : gathered(deferred)) EXPECT_GT(p.abs().min().item<float>(), 0);
  }
  EXPECT_TRUE(bitwise(gathered_buffers(whole), gathered_buffers(deferred)));  // LoRA's base
  for (int64_t s = 1; s <= 4; ++s) {
    whole.trainer->step(s);
    deferred.trainer->step(s);
  }
  EXPECT_TRUE(bitwise(gathered(whole), gathered(deferred)));
  EXPECT_TRUE(bitwise(gathered_buffers(whole), gathered_buffers(deferred)));
  // ddp.shard: none from the same seed: the same numbers, reduced in another layout.
  std::string none = yaml;
  none.replace(none.find("shard: parameters"), 17, "shard: none");
  auto unsharded = make_cpu_run(*comm_, none, "none.yaml");
  for (int64_t s = 1; s <= 4; ++s) unsharded.trainer->step(s);
  EXPECT_LT(relative_error(gathered(deferred), snapshot(*unsharded.model)), 1e-6);
}

const char* const kBuildNames[] = {"gpt", "llama", "llama_tied", "llama_lora",
                                   "llama_lora_init_from"};
INSTANTIATE_TEST_SUITE_P(Models, DeferredBuild,
                         ::testing::Values(std::string(kGpt), llama(false), llama(true),
                                           llama(false) + kLora,
                                           llama(false) + kLora + ", lora_init_from: " + kPeftDir),
                         [](const auto& info) { return std::string(kBuildNames[info.index]); });

// The allocator's peak through the build and the Trainer's set-up: the whole model is never
// allocated (here 32 blocks: a unit is 1/34 of it), the whole-built run holds it until its
// broadcast.
TEST(DeferredBuildMemory, StartUpPeaksAtLeastHalfAModelLower) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  std::string yaml =
      lm_yaml("name: llama, preset: llama-tiny, num_layers: 32, d_model: 64, heads: 4, "
              "kv_heads: 2, intermediate_size: 96");
  auto& guard = memory::CpuAllocatorGuard::instance();
  const auto peak_of = [&](bool deferred, int64_t* model_bytes) {
    guard.reset_peak();
    const int64_t base = guard.allocated_bytes();
    auto run = make_cpu_run(*comm, yaml, "peak.yaml", {}, deferred);
    *model_bytes = 0;  // the base's (with LoRA, its buffers)
    for (const auto& p : run.model->parameters()) *model_bytes += p.numel() * 4;
    for (const auto& b : run.model->buffers()) *model_bytes += b.numel() * 4;
    return guard.peak_bytes() - base;
  };
  int64_t model = 0;
  const int64_t whole = peak_of(false, &model);
  const int64_t deferred = peak_of(true, &model);
  EXPECT_GT(whole - deferred, model / 2)
      << "whole " << whole << ", deferred " << deferred << ", model " << model;
  // LoRA: the frozen base (buffers) is never whole either.
  yaml.replace(yaml.find("intermediate_size: 96"), 21,
               std::string("intermediate_size: 96") + kLora);
  const int64_t whole_lora = peak_of(false, &model);
  const int64_t deferred_lora = peak_of(true, &model);
  EXPECT_GT(whole_lora - deferred_lora, model / 2)
      << "LoRA: whole " << whole_lora << ", deferred " << deferred_lora << ", model " << model;
}

// Rank 0's fresh directory, known to every rank (they share the machine). Collective.
std::string shared_dir(ddp::Communicator& comm, const test::TempDir& mine) {
  const std::string& dir = mine.path();
  at::Tensor length = at::tensor({static_cast<int64_t>(dir.size())}, at::kLong);
  comm.broadcast(length, 0, "dir length");
  at::Tensor bytes = at::zeros({length.item<int64_t>()}, at::kByte);
  if (comm.rank() == 0) std::memcpy(bytes.data_ptr(), dir.data(), dir.size());
  comm.broadcast(bytes, 0, "dir");
  return {static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())};
}

// model.init_from, a Hugging Face Llama directory in shards: the ranges each rank reads make the
// model the whole load makes, and a rank reads about its share of the files.
TEST(DeferredBuildInitFrom, RangesEqualTheWholeLoadAndEachRankReadsItsShare) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const test::TempDir mine;
  const std::string dir = shared_dir(*comm, mine);
  const std::string model = llama(false);
  int64_t file_bytes = 0;
  if (comm->rank() == 0) {
    const auto config = config::parse_config(lm_yaml(model), "source.yaml");
    core::Shape shape;
    shape.vocab_size = 100;
    shape.context = 16;
    at::manual_seed(5);
    auto source = models::create_model(config.model, shape);
    models::export_hf("llama", *source, dir, 12000);
  }
  comm->barrier("exported");
  for (const auto& file : io::safetensors_files(dir)) {
    const io::SafetensorsRangeReader reader(file);  // alive through the loop over its tensors
    for (const auto& [name, info] : reader.tensors()) {
      file_bytes += info.numel * 4;
    }
  }
  const std::string yaml = lm_yaml(model + ", init_from: " + dir);
  auto whole = make_cpu_run(*comm, yaml, "whole.yaml");
  const int64_t before = io::safetensors_bytes_read();
  auto deferred = make_cpu_run(*comm, yaml, "deferred.yaml", {}, /*deferred=*/true);
  const int64_t read = io::safetensors_bytes_read() - before;
  EXPECT_TRUE(bitwise(gathered(whole), gathered(deferred)));
  EXPECT_GT(read, 0);
  EXPECT_LT(read, file_bytes / comm->size() + file_bytes / 8) << "of " << file_bytes;
  // LoRA over the same base: the frozen base read by ranges, the adapters as the whole build's.
  const std::string lora = lm_yaml(model + kLora + ", init_from: " + dir);
  auto whole_lora = make_cpu_run(*comm, lora, "whole_lora.yaml");
  const int64_t before_lora = io::safetensors_bytes_read();
  auto deferred_lora = make_cpu_run(*comm, lora, "deferred_lora.yaml", {}, /*deferred=*/true);
  const int64_t read_lora = io::safetensors_bytes_read() - before_lora;
  EXPECT_TRUE(bitwise(gathered(whole_lora), gathered(deferred_lora)));
  EXPECT_TRUE(bitwise(gathered_buffers(whole_lora), gathered_buffers(deferred_lora)));
  EXPECT_TRUE(bitwise(gathered_buffers(deferred_lora), gathered(whole)))
      << "the frozen base is not the base";
  EXPECT_LT(read_lora, file_bytes / comm->size() + file_bytes / 8) << "of " << file_bytes;
}

// A sharded checkpoint of a deferred run resumes each rank's blocks, parameters and moments,
// from its own ranges; the run continues bitwise as the uninterrupted one.
TEST(DeferredBuildResume, ShardedCheckpointResumesEachRanksRangesOnly) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const test::TempDir mine;
  const std::string path = shared_dir(*comm, mine) + "/step_000002";
  const std::string yaml = lm_yaml(llama(true));
  auto uninterrupted = make_cpu_run(*comm, yaml, "a.yaml", {}, true);
  for (int64_t s = 1; s <= 4; ++s) uninterrupted.trainer->step(s);
  {
    auto first = make_cpu_run(*comm, yaml, "b.yaml", {}, true);
    for (int64_t s = 1; s <= 2; ++s) first.trainer->step(s);
    const auto checkpointer = train::make_checkpointer(*first.trainer, "");
    ASSERT_TRUE(checkpointer->sharded());
    checkpointer->save(path, 2, first.trainer->run_state());
    checkpointer->finish();
  }
  auto resumed = make_cpu_run(*comm, yaml, "c.yaml", {}, true);
  std::optional<checkpoint::Checkpoint> ckpt;
  if (comm->rank() == 0) {  // as the launcher: opened, checked, the buffers applied
    ckpt = checkpoint::read_checkpoint(path, checkpoint::ShardedRead::kOpen);
    checkpoint::check_compatible(*ckpt, *resumed.model);
    checkpoint::apply_model_state(*ckpt, *resumed.model);
  }
  const auto checkpointer = train::make_checkpointer(*resumed.trainer, "");
  EXPECT_EQ(train::resume(*checkpointer, *resumed.trainer, ckpt ? &*ckpt : nullptr), 2);
  int64_t total = 0;  // parameters and both moments, as the files hold them
  for (const auto& p : resumed.model->parameters()) total += 3 * p.numel() * 4;
  EXPECT_GT(checkpointer->resume_bytes_read(), 0);
  EXPECT_LT(checkpointer->resume_bytes_read(), total / comm->size() + total / 8) << total;
  for (int64_t s = 3; s <= 4; ++s) resumed.trainer->step(s);
  EXPECT_TRUE(bitwise(gathered(resumed), gathered(uninterrupted)));
}

struct OomRun {
  std::vector<at::Tensor> params;
  int fallbacks = 0;
  bool buffers_unchanged = true;  // every buffer (LoRA's frozen base) bitwise as it started
  int frozen_held = 0;  // buffers that hold storage between steps (under parameters: none)
};

// Built without storage (LoRA's frozen base too), as the launcher builds it.
OomRun train_with(ddp::Communicator& comm, const std::string& yaml, const std::string& inject) {
  auto& guard = memory::CpuAllocatorGuard::instance();
  guard.set_injections(comm.rank(), memory::parse_injections(inject));
  struct Reset {
    ~Reset() { memory::CpuAllocatorGuard::instance().set_injections(0, {}); }
  } reset;
  auto run = make_cpu_run(comm, yaml, "oom.yaml", {}, /*deferred=*/true);
  std::vector<at::Tensor> buffers;
  {
    const auto pinned = trainer_test::pin_parameters(*run.trainer);
    for (const auto& b : run.model->buffers()) buffers.push_back(b.detach().clone());
  }
  for (int64_t s = 1; s <= 4; ++s) run.trainer->step(s);
  OomRun out{gathered(run), run.trainer->fallbacks()};
  // Between steps the frozen base is sharded with its units (no storage); pinned, it is whole.
  for (const auto& b : run.model->buffers()) out.frozen_held += models::holds_no_storage(b) ? 0 : 1;
  const auto pinned = trainer_test::pin_parameters(*run.trainer);
  const auto after = run.model->buffers();
  out.buffers_unchanged = after.size() == buffers.size();
  for (size_t i = 0; out.buffers_unchanged && i < buffers.size(); ++i)
    out.buffers_unchanged = at::equal(after[i], buffers[i]);
  return out;
}

// The rung from a failure, or from the start: checkpoint_activations (the default ladder's first)
// and halve_micro_batch (micro-batch 2 -> 1: two micro-batches become four).
TEST(ShardedOom, FailureTakesTheRungOnEveryRankAndMatchesTheRungFromTheStart) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const int last = comm->size() - 1;
  for (const std::string& model : {std::string(kGpt), llama(true)}) {
    const OomRun checkpointed =
        train_with(*comm, lm_yaml(model + ", checkpoint_activations: true"), "");
    std::string from_start = lm_yaml(model);
    from_start.replace(from_start.find("micro_batch_size: 2"), 19, "micro_batch_size: 1");
    const OomRun halved = train_with(*comm, from_start, "");
    for (const std::string& inject :
         std::vector<std::string>{"0:3:forward", fmt::format("{}:2:backward", last),
                                  fmt::format("{}:1:forward", last), "0:4:backward"}) {
      const OomRun rung = train_with(*comm, lm_yaml(model), inject);
      EXPECT_EQ(rung.fallbacks, 1) << inject;
      EXPECT_LT(relative_error(rung.params, checkpointed.params), 1e-6) << model << " " << inject;
      std::string halving = lm_yaml(model);
      halving.replace(halving.find("memory: {check_every: 0}"), 24,
                      "memory: {check_every: 0, fallback: [halve_micro_batch]}");
      const OomRun half = train_with(*comm, halving, inject);
      EXPECT_EQ(half.fallbacks, 1) << inject;
      EXPECT_LT(relative_error(half.params, halved.params), 1e-6) << model << " " << inject;
    }
  }
}

// LoRA (model.lora_rank) under parameters, in fp32, under bf16 autocast and in fp16 with its loss
// scale: an injected failure
// takes the rung on every rank and ends with the adapters of a run that checkpointed activations
// from the start, the frozen base bitwise as it started.
TEST(ShardedOom, LoraAdaptersTakeTheRungWithTheBaseFrozen) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const std::string model = llama(false) + kLora;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    const auto yaml = [&](const std::string& m) {
      std::string y = lm_yaml(m);
      y.replace(y.find("seed: 11"), 8, "seed: 11, precision: " + precision);
      return y;
    };
    const OomRun from_start = train_with(*comm, yaml(model + ", checkpoint_activations: true"), "");
    EXPECT_TRUE(from_start.buffers_unchanged) << precision;
    EXPECT_EQ(from_start.frozen_held, 0) << precision << ": the frozen base is not sharded";
    // In backward, and in forward (the failed pass's walk then covers every unit's backward,
    // the frozen embeddings' included, which the others never gather for it).
    for (const std::string& inject :
         {fmt::format("{}:2:backward", comm->size() - 1), std::string("0:3:forward")}) {
      const OomRun rung = train_with(*comm, yaml(model), inject);
      EXPECT_EQ(rung.fallbacks, 1) << precision << " " << inject;
      EXPECT_TRUE(rung.buffers_unchanged) << precision << " " << inject;
      EXPECT_EQ(rung.frozen_held, 0) << precision << ": the frozen base is not sharded";
      EXPECT_LT(relative_error(rung.params, from_start.params), 1e-6) << precision << " " << inject;
    }
  }
}

// A single-file checkpoint under parameters gathers the adapters whole, not the frozen base,
// which it does not save: while its gather is held the base's buffers hold no storage (the
// parameters all do); pinned for a whole model (--export-hf, tests) the base is whole too.
TEST(DeferredBuild, CheckpointGatherLeavesTheFrozenBaseSharded) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  auto run = make_cpu_run(*comm, lm_yaml(llama(false) + kLora), "ckpt.yaml", {}, /*deferred=*/true);
  run.trainer->step(1);
  const auto held = [&](const std::vector<at::Tensor>& tensors) {
    int n = 0;
    for (const auto& t : tensors) n += models::holds_no_storage(t) ? 0 : 1;
    return n;
  };
  const auto buffers = run.model->buffers();
  const auto parameters = run.model->parameters();
  {
    const auto gathered = run.trainer->run_state().gather_units();
    ASSERT_NE(gathered, nullptr);
    EXPECT_EQ(held(run.model->parameters()), static_cast<int>(parameters.size()));
    EXPECT_EQ(held(run.model->buffers()), 0) << "the frozen base was gathered for a checkpoint";
  }
  EXPECT_EQ(held(run.model->buffers()), 0);
  {
    const auto pinned = trainer_test::pin_parameters(*run.trainer);
    EXPECT_EQ(held(run.model->buffers()), static_cast<int>(buffers.size()));
  }
  run.trainer->step(2);  // the units gather their base again for the step
}

TEST(ShardedOom, ThirtySeededRandomInjectionsAllComplete) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const std::string yaml = lm_yaml(llama(false));
  const OomRun reference = train_with(*comm, yaml, "");
  std::mt19937 gen(20261127);  // the same sequence on every rank
  for (int i = 0; i < 30; ++i) {
    const int rank = std::uniform_int_distribution<int>(0, comm->size() - 1)(gen);
    const int step = std::uniform_int_distribution<int>(1, 4)(gen);
    const char* phase = std::uniform_int_distribution<int>(0, 1)(gen) ? "forward" : "backward";
    const std::string inject = fmt::format("{}:{}:{}", rank, step, phase);
    const OomRun run = train_with(*comm, yaml, inject);
    EXPECT_EQ(run.fallbacks, 1) << inject;
    // checkpoint_activations changes no number
    EXPECT_LT(relative_error(run.params, reference.params), 1e-6) << inject;
  }
}

// Evaluation's slices (7 samples: 4 + 3 at 2 ranks, 3 + 2 + 2 at 3, so two forwards on rank 0
// and one on the others at 3 ranks with batch 2), a multiple-choice task's, and rank 0's greedy
// generation under parameters: the unsharded run's metrics, the pinned model's ids, and never
// more than about a unit gathered for evaluation (the model is 8 blocks).
TEST(LockstepUnits, EvaluationAndGenerationGatherInStep) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  const std::string model = "name: gpt, preset: tiny, num_layers: 8, d_model: 64, heads: 4";
  auto sharded = make_cpu_run(*comm, lm_yaml(model), "p.yaml", {}, true);
  std::string none = lm_yaml(model);
  none.replace(none.find("shard: parameters"), 17, "shard: none");
  auto unsharded = make_cpu_run(*comm, none, "n.yaml");
  for (int64_t s = 1; s <= 2; ++s) {
    sharded.trainer->step(s);
    unsharded.trainer->step(s);
  }
  int64_t model_bytes = 0;
  for (const auto& p : sharded.model->parameters()) model_bytes += p.numel() * 4;
  auto& guard = memory::CpuAllocatorGuard::instance();
  const int64_t base = guard.allocated_bytes();
  guard.reset_peak();
  // Validation then a multiple-choice task in one scope, as evaluate_and_log runs them: each
  // slice's forwards differ in number between ranks (one forward per example: 3, 2, 2 at 3).
  data::ChoiceTask task{"random", "random.bin", {}};
  for (int64_t i = 0; i < 7; ++i) {
    data::ChoiceExample e;
    for (int64_t j = 0; j < 2 + i % 5; ++j) e.context.push_back((i * 7 + j * 3) % 50);
    for (int64_t k = 0; k < 2 + (i % 3); ++k) e.endings.push_back({(i + k) % 50, (i * k) % 50});
    e.label = i % 2;
    task.examples.push_back(std::move(e));
  }
  auto units = sharded.trainer->units_in_step();
  const auto m =
      train::evaluate_validation(*comm, *sharded.model, *sharded.dataset->validation(), 2, 7);
  const train::ChoiceCounts choice = train::evaluate_choice_task(*comm, *sharded.model, task);
  units->finish();
  EXPECT_LT(guard.peak_bytes() - base, model_bytes / 2) << "model " << model_bytes;
  const auto reference =
      train::evaluate_validation(*comm, *unsharded.model, *unsharded.dataset->validation(), 2, 7);
  ASSERT_EQ(m.samples, 7);
  EXPECT_EQ(m.samples, reference.samples);
  ASSERT_EQ(m.means.size(), reference.means.size());
  for (size_t i = 0; i < m.means.size(); ++i) {
    EXPECT_NEAR(m.means[i].second, reference.means[i].second, 1e-5) << m.means[i].first;
  }
  const train::ChoiceCounts choice_reference =
      train::evaluate_choice_task(*comm, *unsharded.model, task);
  EXPECT_EQ(choice.examples, 7);
  // The same weights up to the reductions' rounding: a near tie may decide one example otherwise.
  EXPECT_NEAR(choice.acc, choice_reference.acc, 1);
  EXPECT_NEAR(choice.acc_norm, choice_reference.acc_norm, 1);
  models::SamplingOptions o;
  o.max_new_tokens = 8;
  o.temperature = 0;
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
  std::vector<int64_t> in_step;
  units = sharded.trainer->units_in_step();
  if (comm->rank() == 0) in_step = models::generate(*sharded.model, prompt, o);
  units->finish();
  const auto pinned = trainer_test::pin_parameters(*sharded.trainer);
  if (comm->rank() == 0) {
    EXPECT_EQ(in_step, models::generate(*sharded.model, prompt, o));
  }
}

}  // namespace TRAINER_UNITY_ID
