// Building a language model without storage (models/deferred_init.h) and what goes with it (issue
// 39), in one process:
// - llama (tied and untied) and gpt built without storage, materialised unit by unit, hold
//   bitwise the values of the same model built whole (gpt draws wte's GPT-2 initialisation after
//   every block: the out-of-order replay), and the default generator ends where it would have;
// - building allocates nothing, and materialising holds one unit at a time (the CPU allocator
//   guard's counter: never a whole model);
// - a construction that draws random numbers for real inside the scope is refused;
// - model.init_from read by ranges (llama's fused q/k/v and padded vocabulary, gpt's Conv1D
//   transposes; F32, BF16, F16; one file and an index's shards) equals the whole load and reads
//   only the bytes of the elements asked for;
// - an export streamed from a reader is, file for file and byte for byte, the model's export;
// - LmShape lists each model's parameters, sizes and units exactly.
#include "models/deferred_init.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "config/config.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "memory/allocator_guard.h"
#include "models/capabilities.h"
#include "models/lm/causal_lm.h"
#include "models/lm/hf_ranges.h"
#include "models/lm/lm_shape.h"
#include "models/registry.h"

namespace TRAINER_UNITY_ID {

namespace fs = std::filesystem;

models::ModelOptions llama_options(bool tied) {
  models::ModelOptions o;
  o.name = "llama";
  o.preset = "llama-tiny";
  o.num_layers = 3;
  o.d_model = 48;
  o.heads = 6;
  o.kv_heads = 2;
  o.intermediate_size = 72;
  o.tie_embeddings = tied ? "true" : "false";
  return o;
}

// Llama's kin (qwen2: q, k, v biases; qwen3: q and k norms, an explicit head_dim; mistral: a
// window; gemma3: four norms a block, q and k norms, windows and two rotaries) with the same
// dimensions.
models::ModelOptions kin_options(const std::string& family, bool tied) {
  models::ModelOptions o = llama_options(tied);
  o.name = family;
  o.preset = family + "-tiny";
  if (family == "qwen3" || family == "gemma3") o.head_dim = 12;
  return o;
}

models::ModelOptions gpt_options() {
  models::ModelOptions o;
  o.name = "gpt";
  o.preset = "tiny";
  o.num_layers = 3;
  return o;
}

core::Shape tokens(int64_t vocab = 61, int64_t context = 16) {
  core::Shape s;
  s.vocab_size = vocab;
  s.context = context;
  return s;
}

std::shared_ptr<models::Model> build(const models::ModelOptions& o, bool deferred,
                                     const core::Shape& shape = tokens()) {
  at::manual_seed(1234);
  if (!deferred) return models::create_model(o, shape);
  models::DeferredInit scope(c10::Device(c10::kCPU));
  auto model = models::create_model(o, shape);
  model->set_deferred_init(scope.finish(*model));
  return model;
}

// Every parameter of a deferred model, materialised unit by unit into fresh tensors.
std::map<std::string, at::Tensor> materialise(models::Model& model) {
  const auto named = model.named_parameters();
  std::map<std::string, at::Tensor> by_name;
  for (const auto& item : named) by_name[item.key()] = item.value();
  std::vector<std::vector<std::string>> names =
      models::as<models::ParameterUnits>(model)->parameter_units();
  std::vector<std::vector<at::Tensor>> units;
  for (const auto& unit : names) {
    auto& u = units.emplace_back();
    for (const auto& n : unit) u.push_back(by_name.at(n));
  }
  std::map<std::string, at::Tensor> out;
  models::materialise_units(
      *model.deferred_init(), units,
      [&](size_t u) {
        std::vector<at::Tensor> into;
        for (const auto& n : names[u]) into.push_back(out[n] = at::zeros(by_name.at(n).sizes()));
        return into;
      },
      [](size_t) {});
  return out;
}

at::Tensor cpu_generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

void expect_deferred_equals_whole(const models::ModelOptions& o) {
  const auto whole = build(o, false);
  const at::Tensor after_whole = cpu_generator_state();
  const auto deferred = build(o, true);
  for (const auto& p : deferred->parameters()) ASSERT_TRUE(models::holds_no_storage(p));
  const auto values = materialise(*deferred);
  EXPECT_TRUE(at::equal(cpu_generator_state(), after_whole));
  for (const auto& item : whole->named_parameters()) {
    ASSERT_TRUE(values.count(item.key())) << item.key();
    EXPECT_TRUE(at::equal(values.at(item.key()), item.value())) << item.key();
  }
  EXPECT_EQ(values.size(), whole->named_parameters().size());
}

// The deferred build's one rule, asked by name before the build and of the built model, agrees
// for every model the registry builds (each from data with every field its factory reads).
TEST(DeferredInit, BuildsWithoutStorageAgreesByNameAndByModel) {
  core::Shape shape = tokens();
  shape.input_dim = 4;
  shape.num_classes = 3;
  shape.num_users = 5;
  shape.num_items = 6;
  shape.item_text = at::full({6, 8}, core::kTextPadId, at::kLong);
  shape.window = 4;
  shape.features = 2;
  shape.horizon = 2;
  shape.targets = 1;
  shape.channels = 1;
  shape.scale = 1;
  int lms = 0;
  for (const std::string& name : models::model_names()) {
    // A language model at a tiny shape, any other with the schema's defaults.
    models::ModelOptions o =
        name == "gpt" ? gpt_options()
        : models::builds_without_storage(name)
            ? kin_options(name, false)
            : config::parse_config("model: {name: " + name + "}\ntrain: {global_batch_size: 8}\n",
                                   "test")
                  .model;
    const auto model = models::create_model(o, shape);
    EXPECT_EQ(models::builds_without_storage(name), models::builds_without_storage(*model)) << name;
    lms += models::builds_without_storage(name) ? 1 : 0;
  }
  EXPECT_EQ(lms, static_cast<int>(models::language_model_names().size()));
}

TEST(DeferredInit, LlamaMaterialisesBitwiseAsBuiltWhole) {
  expect_deferred_equals_whole(llama_options(false));
  expect_deferred_equals_whole(llama_options(true));
  expect_deferred_equals_whole(kin_options("qwen2", true));
  expect_deferred_equals_whole(kin_options("qwen3", false));
  expect_deferred_equals_whole(kin_options("gemma3", true));
}

// gpt draws wte's and wpe's N(0, 1) first and GPT-2's N(0, 0.02) for them after every block.
TEST(DeferredInit, GptMaterialisesBitwiseAsBuiltWhole) {
  expect_deferred_equals_whole(gpt_options());
}

int64_t bytes_of(models::Model& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel() * 4;
  return n;
}

// The allocator's counter: nothing for the build, at most one unit (and a passed parameter's
// scratch) at a time for the materialisation; the model whole is 30x its largest block here.
TEST(DeferredInit, NeverAllocatesTheWholeModel) {
  auto& guard = memory::CpuAllocatorGuard::instance();
  models::ModelOptions o = llama_options(false);
  o.num_layers = 24;
  const core::Shape shape = tokens(64, 16);
  const int64_t before = guard.allocated_bytes();
  const auto model = build(o, true, shape);
  EXPECT_LT(guard.allocated_bytes() - before, 64 << 10);  // some small bookkeeping at most
  const int64_t whole = bytes_of(*model);
  int64_t largest_unit = 0, largest_param = 0;
  const auto units = models::as<models::ParameterUnits>(*model)->parameter_units();
  std::map<std::string, int64_t> bytes;
  for (const auto& item : model->named_parameters()) bytes[item.key()] = item.value().numel() * 4;
  for (const auto& unit : units) {
    int64_t u = 0;
    for (const auto& n : unit) {
      u += bytes[n];
      largest_param = std::max(largest_param, bytes[n]);
    }
    largest_unit = std::max(largest_unit, u);
  }
  std::vector<std::vector<at::Tensor>> params;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& item : model->named_parameters()) by_name[item.key()] = item.value();
  for (const auto& unit : units) {
    auto& u = params.emplace_back();
    for (const auto& n : unit) u.push_back(by_name[n]);
  }
  std::vector<at::Tensor> open;
  const int64_t base = guard.allocated_bytes();
  guard.reset_peak();
  models::materialise_units(
      *model->deferred_init(), params,
      [&](size_t u) {
        for (const auto& n : units[u]) open.push_back(at::zeros(by_name[n].sizes()));
        return open;
      },
      [&](size_t) { open.clear(); });
  const int64_t peak = guard.peak_bytes() - base;
  EXPECT_LE(peak, largest_unit + largest_param + (256 << 10)) << "whole model " << whole;
  EXPECT_LT(peak, whole / 4);
}

TEST(DeferredInit, RefusesRealDrawsInsideTheScope) {
  at::manual_seed(1);
  models::DeferredInit scope(c10::Device(c10::kCPU));
  auto model = models::create_model(llama_options(false), tokens());
  (void)at::randn({16});  // a module drawing for real would shift the replayed draws
  EXPECT_THROW(scope.finish(*model), std::logic_error);
}

// The exported Hugging Face directory of a model built whole, then converted to `dtype`.
void write_hf(models::Model& model, const std::string& name, const std::string& dir,
              int64_t max_shard_bytes, at::ScalarType dtype) {
  models::export_hf(name, model, dir, max_shard_bytes);
  if (dtype == at::kFloat) return;
  for (const auto& file : io::safetensors_files(dir)) {
    std::map<std::string, at::Tensor> converted;
    for (const auto& [key, t] : io::read_safetensors(file)) converted[key] = t.to(dtype);
    io::write_safetensors(file, converted, {{"format", "pt"}});
  }
}

// Every parameter read by ranges (a few cuts each) equals the model loaded whole from the same
// files; each read costs only its elements' bytes (transposed: at most two rows more).
void expect_ranges_equal_whole(models::ModelOptions o, const std::string& dir) {
  o.init_from = dir;
  const auto whole = build(o, false);
  const auto deferred = build(o, true);
  const models::ParameterReader& read = deferred->deferred_init()->read;
  ASSERT_TRUE(read);
  for (const auto& item : whole->named_parameters()) {
    const at::Tensor flat = item.value().detach().reshape({-1});
    const int64_t n = flat.numel(), row = item.value().dim() > 1 ? item.value().size(1) : 1;
    for (const auto& [first, count] :
         std::vector<std::pair<int64_t, int64_t>>{{0, n},
                                                  {n / 3, n / 3 + 1},
                                                  {n - 1, 1},
                                                  {row / 2, std::min<int64_t>(n - row / 2, 5)}}) {
      const at::Tensor out = at::full({count}, 7.0F);
      const int64_t read_before = io::safetensors_bytes_read();
      read(item.key(), first, out);
      const int64_t read_bytes = io::safetensors_bytes_read() - read_before;
      EXPECT_TRUE(at::equal(out, flat.narrow(0, first, count))) << item.key() << " " << first;
      EXPECT_LE(read_bytes, (count + 2 * row) * 4) << item.key() << " " << first;
    }
  }
}

TEST(DeferredInit, LlamaInitFromReadsRangesOfEveryDtypeAndLayout) {
  for (const bool tied : {false, true}) {
    const auto source = build(llama_options(tied), false);
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const int64_t shard : {int64_t{1} << 30, int64_t{6000}}) {
        const test::TempDir dir;
        write_hf(*source, "llama", dir.path(), shard, dtype);
        expect_ranges_equal_whole(llama_options(tied), dir.path());
      }
    }
  }
}

TEST(DeferredInit, GptInitFromReadsTransposedRanges) {
  const auto source = build(gpt_options(), false);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const test::TempDir dir;
    write_hf(*source, "gpt", dir.path(), int64_t{1} << 30, dtype);
    expect_ranges_equal_whole(gpt_options(), dir.path());
  }
}

// A tied Llama's file whose lm_head differs from its embedding: the rank reading those rows
// says so.
TEST(DeferredInit, TiedHeadThatDiffersIsAnInitError) {
  const auto source = build(llama_options(true), false);
  const test::TempDir dir;
  write_hf(*source, "llama", dir.path(), int64_t{1} << 30, at::kFloat);
  const std::string file = dir.path() + "/model.safetensors";
  auto tensors = io::read_safetensors(file);
  tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight") + 1;
  io::write_safetensors(file, tensors, {{"format", "pt"}});
  models::ModelOptions o = llama_options(true);
  o.init_from = dir.path();
  const auto deferred = build(o, true);
  const at::Tensor out = at::empty({10});
  try {
    deferred->deferred_init()->read("embed_tokens.weight", 0, out);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("lm_head.weight differs from the model's "
                                               "embed_tokens.weight"));
  }
}

std::string bytes_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The export streamed from a reader of another model's values is the export of that model.
TEST(DeferredInit, StreamedExportEqualsTheModelsExport) {
  for (const std::string name : {"llama", "gpt"}) {
    const models::ModelOptions o = name == "llama" ? llama_options(false) : gpt_options();
    const auto whole = build(o, false);
    const auto deferred = build(o, true);
    const test::TempDir a, b;
    models::export_hf(name, *whole, a.path(), 9000);
    models::export_hf(name, *deferred, b.path(), 9000, models::model_reader(*whole));
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(a.path())) files.push_back(e.path().filename());
    ASSERT_GT(files.size(), 3u) << "sharded: several files and the index";
    for (const auto& f : files) {
      EXPECT_EQ(bytes_of_file(a.path() + "/" + f), bytes_of_file(b.path() + "/" + f)) << f;
    }
  }
}

// LoRA on `o`: rank 4 on `targets` (empty: the family's default, the attention's projections).
models::ModelOptions with_lora(models::ModelOptions o, std::vector<std::string> targets) {
  o.lora_rank = 4;
  o.lora_alpha = 8;
  o.lora_targets = std::move(targets);
  return o;
}

// LmShape's parameters are the model's, in order, with their sizes and units; with LoRA, the
// adapters, and frozen_count() the base's buffers.
TEST(DeferredInit, LmShapeListsTheModelsParametersAndUnits) {
  const std::vector<std::string> every_llama = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
  for (const auto& o :
       {llama_options(false), llama_options(true), gpt_options(), kin_options("qwen2", true),
        kin_options("qwen3", false), kin_options("mistral", false), kin_options("gemma3", true),
        kin_options("gemma3", false), with_lora(kin_options("gemma3", false), every_llama),
        with_lora(kin_options("qwen3", true), every_llama),
        with_lora(kin_options("qwen2", false), {}), with_lora(kin_options("mistral", true), {}),
        with_lora(llama_options(false), {}), with_lora(llama_options(true), every_llama),
        with_lora(gpt_options(), {}), with_lora(gpt_options(), {"c_attn", "c_proj", "c_fc"}),
        with_lora(gpt_options(), {"c_fc"})}) {
    SCOPED_TRACE(o.name + (o.has_adapters() ? " with LoRA" : ""));
    const auto model = build(o, true);
    const models::LmShape shape = models::as<models::ShapePlanning>(*model)->lm_shape();
    const auto params = shape.parameters();
    const auto named = model->named_parameters();
    ASSERT_EQ(params.size(), named.size());
    const auto units = models::as<models::ParameterUnits>(*model)->parameter_units();
    std::map<std::string, size_t> unit_of;
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& n : units[u]) unit_of[n] = u;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].name, named[i].key());
      EXPECT_EQ(params[i].numel, named[i].value().numel()) << params[i].name;
      EXPECT_EQ(params[i].unit, unit_of.at(params[i].name)) << params[i].name;
    }
    EXPECT_EQ(shape.units(), units.size());
    int64_t buffers = 0;
    for (const auto& b : model->buffers()) buffers += b.numel();
    EXPECT_EQ(shape.frozen_count(), o.has_adapters() ? buffers : 0);
    EXPECT_EQ(shape.has_adapters(), models::as<models::Adapters>(*model)->has_adapters());
  }
}

}  // namespace TRAINER_UNITY_ID
