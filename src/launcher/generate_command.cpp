#include "launcher/generate_command.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "config/config.h"
#include "data/chat_prompt.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "io/shard_manifest.h"
#include "launcher/device.h"
#include "launcher/exit_codes.h"
#include "launcher/exit_status.h"
#include "launcher/launch.h"
#include "launcher/resume.h"
#include "launcher/serving_files.h"
#include "models/deferred_init.h"
#include "models/language_model.h"
#include "models/lm/causal_lm.h"
#include "models/lm/generate.h"
#include "models/lm/hf_ranges.h"
#include "models/lm/lora.h"
#include "models/registry.h"
#include "train/options.h"

namespace launcher {
namespace {

void say(const std::string& line) {
  fmt::print(stderr, "trainer: {}\n", line);
  std::fflush(stderr);
}

// A model and where its weights came from.
struct Loaded {
  std::shared_ptr<models::LanguageModel> model;
  std::string weights;  // "" when untrained
};

// The model as training builds it, with the weights the config names (generate_command.h).
// Throws what create_model and the checkpoint reader throw.
Loaded load_model(const config::Config& config, const char* command) {
  core::Shape shape;
  shape.vocab_size = config.data.vocab_size;
  shape.context = config.data.context;
  at::manual_seed(config.train.seed);  // untrained weights: the ones training would start from
  Loaded out;
  out.model = models::create_language_model(config.model, shape, command);
  if (const auto found = select_resume(config.checkpoint, *out.model, ResumeFor::kWeights)) {
    out.weights = fmt::format("checkpoint {} ({} steps done)", found->path, found->meta.step);
  } else if (!config.model.init_from.empty()) {
    out.weights = fmt::format("model.init_from {}", config.model.init_from);
  }
  return out;
}

// The device the command runs on, made current and under the config's memory limits.
c10::Device inference_device(const config::Config& config) {
  const std::string& wanted = config.train.device;
  const bool cuda = wanted == "cuda" || (wanted == "auto" && at::hasCUDA());
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  use_device(device, config.memory, 0);
  return device;
}

// Runs `body`; what it throws becomes a message and an exit code through the start-up table of
// launcher/exit_status.h, as an error in a start-up phase of training does. `doing` names the
// command in an out-of-memory message.
template <class Fn>
int guarded(const char* doing, Fn&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const ExitStatus status = *exit_status(startup_rules(), e, doing);  // ends with std::exception
    print_error(0, status.message);
    return status.code;
  }
}

// What lies at `path` for refuse_to_overwrite's message: "" when nothing (or an empty directory)
// would be written over.
std::string what_is_at(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (ec || !fs::exists(st)) return "";
  if (fs::is_directory(st)) return fs::is_empty(path, ec) && !ec ? "" : "a directory with files";
  try {  // a checkpoint says which
    const auto meta = io::read_safetensors_metadata(path);
    if (const auto step = meta.find("step"); step != meta.end())
      return fmt::format("a checkpoint of {} steps", step->second);
  } catch (const io::SafetensorsError&) {
  }
  return "a file";
}

// --consolidate, --export-hf and --export-peft never write over what a user would miss
// (generate_command.h).
void refuse_to_overwrite(const char* flag, const std::string& path, bool force) {
  const std::string there = force ? "" : what_is_at(path);
  if (there.empty()) return;
  throw std::invalid_argument(
      fmt::format("{}: {} exists ({}) and is not overwritten: write elsewhere, move it away, or "
                  "give --force",
                  flag, path, there));
}

// Under mpirun every rank runs main(); one process is enough. The one that works logs warnings
// to stderr: stdout is the command's output (generated text).
bool other_rank() {
  if (launcher_rank(process_environment()) != 0) return true;
  auto logger = spdlog::stderr_logger_st("trainer");
  logger->set_pattern("trainer: %l: %v");
  logger->set_level(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return false;
}

}  // namespace

namespace {

// The prompt's ids, and what ends the sampling, for a prompt or (--chat) a user's turn.
std::vector<int64_t> prompt_ids(const config::Config& config, const GenerateArgs& args,
                                const data::Tokenizer& tokenizer, models::SamplingOptions& o) {
  o.stop_id = tokenizer.end_of_text();
  if (args.chat && !args.prompt.empty()) {
    throw std::invalid_argument("--generate takes a PROMPT or --chat QUESTION, not both");
  }
  if (args.chat) {
    const std::string path = data::find_chat_prompt(config.data.path, config.model.init_from);
    if (path.empty()) {
      throw std::invalid_argument(fmt::format(
          "--chat: no {} in data.path ({}) or beside model.init_from ({}): scripts/"
          "tokenize_text.py --chat writes it beside the shards it makes",
          data::kChatPromptName, config.data.path.empty() ? "not set" : config.data.path,
          config.model.init_from.empty() ? "not set" : config.model.init_from));
    }
    const data::ChatPrompt chat = data::read_chat_prompt(path);
    say(fmt::format("chat: the user's turn rendered as {} says", path));
    o.stop_ids = chat.stop_ids;
    return data::chat_prompt_ids(chat, tokenizer.encode(*args.chat));
  }
  std::vector<int64_t> prompt = tokenizer.encode(args.prompt);
  if (prompt.empty() && tokenizer.end_of_text()) prompt.push_back(*tokenizer.end_of_text());
  if (prompt.empty()) throw std::invalid_argument("--generate: the prompt is empty");
  return prompt;
}

}  // namespace

int run_generate(const std::string& config_path, const std::vector<std::string>& overrides,
                 const GenerateArgs& args) {
  if (other_rank()) return kExitOk;
  return guarded("in --generate", [&] {
    const config::Config config = config::load_config(config_path, overrides);
    const c10::Device device = inference_device(config);
    const auto tokenizer = data::choose_tokenizer(config.data, config.model.init_from);
    Loaded loaded = load_model(config, "--generate");
    if (loaded.weights.empty()) {
      say("warning: no checkpoint (checkpoint.resume, checkpoint.dir) and no model.init_from: "
          "sampling from the untrained model");
    } else {
      say(fmt::format("weights: {}", loaded.weights));
    }
    loaded.model->to(device);
    models::SamplingOptions o;
    o.max_new_tokens = args.max_new_tokens;
    o.temperature = args.temperature;
    o.top_k = args.top_k;
    o.seed = args.seed;
    const std::vector<int64_t> prompt = prompt_ids(config, args, *tokenizer, o);
    const auto ids = models::generate(*loaded.model, prompt, o);
    const int64_t room = loaded.model->context() - static_cast<int64_t>(prompt.size());
    if (args.max_new_tokens > room) {
      say(fmt::format("the model holds {} positions: {} new tokens after the prompt's {}",
                      loaded.model->context(), room, prompt.size()));
    }
    // The prompt as given (a chat: the reply alone), then the continuation's text as it reads
    // after the prompt (data::decode_continuation); the id that stopped it (end of text, end of
    // turn) is not spelled.
    std::vector<int64_t> spelled = ids;
    const bool stopped = !spelled.empty() && ((o.stop_id && spelled.back() == *o.stop_id) ||
                                              std::find(o.stop_ids.begin(), o.stop_ids.end(),
                                                        spelled.back()) != o.stop_ids.end());
    if (stopped) spelled.pop_back();
    fmt::print("{}{}\n", args.chat ? std::string() : args.prompt,
               data::decode_continuation(*tokenizer, prompt, spelled));
    std::fflush(stdout);
    return kExitOk;
  });
}

namespace {

// --export-hf's model: built without storage (models/deferred_init.h), its weights read where
// they lie as the export needs them, one tensor at a time: a sharded checkpoint's ranges,
// model.init_from's ranges, or a single-file checkpoint's tensors (read whole: that format is
// one file). `read` is empty when there are no weights, and with LoRA adapters: that model is
// built whole, as --generate builds it, and written with the adapters merged into the base
// (models/lm/hf_ranges.h, export_reader). `weights` is empty when there are none.
struct ToExport {
  std::shared_ptr<models::LanguageModel> model;
  models::ParameterReader read;
  std::string weights;
};

ToExport model_to_export(const config::Config& config) {
  core::Shape shape;
  shape.vocab_size = config.data.vocab_size;
  shape.context = config.data.context;
  ToExport out;
  if (config.model.has_adapters()) {
    // The frozen base is buffers (models/lm/lora.h), which a deferred build leaves without
    // storage and no ParameterReader reads: the base and the adapters are loaded whole.
    Loaded loaded = load_model(config, "--export-hf");
    out.model = std::move(loaded.model);
    out.weights = std::move(loaded.weights);
    return out;
  }
  {
    models::DeferredInit scope(c10::Device(c10::kCPU));
    out.model = models::create_language_model(config.model, shape, "--export-hf");
    out.model->set_deferred_init(scope.finish(*out.model));
  }
  if (const auto found = select_resume(config.checkpoint, *out.model, ResumeFor::kWeights)) {
    out.weights = fmt::format("checkpoint {} ({} steps done)", found->path, found->meta.step);
    out.read = checkpoint::parameter_reader(*found);
  } else if (!config.model.init_from.empty()) {
    out.weights = fmt::format("model.init_from {}", config.model.init_from);
    out.read = out.model->deferred_init()->read;
  }
  return out;
}

}  // namespace

namespace {

// --export-dtype's dtype, or train.precision's when it is not given.
at::ScalarType export_dtype(const std::string& flag, train::Precision precision) {
  if (flag.empty()) {
    return precision == train::Precision::kBf16   ? at::kBFloat16
           : precision == train::Precision::kFp16 ? at::kHalf
                                                  : at::kFloat;
  }
  if (flag == "bf16") return at::kBFloat16;
  if (flag == "fp16") return at::kHalf;
  if (flag == "fp32") return at::kFloat;
  throw std::invalid_argument(fmt::format("--export-dtype: '{}' is not bf16, fp16 or fp32", flag));
}

// What --export-hf wrote beside the weights, for its message.
std::string serving_note(const ServingFiles& files) {
  const std::string names = fmt::format("{}", fmt::join(files.written, ", "));
  if (files.tokenizer.empty()) {
    return fmt::format("{}; no tokenizer: {}: copy one in before serving", names,
                       files.no_tokenizer);
  }
  return fmt::format("{} (the tokenizer from {})", names, files.tokenizer);
}

}  // namespace

int run_export_hf(const std::string& config_path, const std::vector<std::string>& overrides,
                  const std::string& dir, const ExportHfArgs& args) {
  if (other_rank()) return kExitOk;
  return guarded("in --export-hf", [&] {
    const config::Config config = config::load_config(config_path, overrides);
    refuse_to_overwrite("--export-hf", dir, args.force);
    use_device(c10::Device(c10::kCPU), config.memory, 0);  // exported from the CPU
    const ToExport loaded = model_to_export(config);
    if (loaded.weights.empty()) {
      throw std::invalid_argument(
          fmt::format("--export-hf: no weights to export: no checkpoint in checkpoint.dir ({}), "
                      "checkpoint.resume ({}) and model.init_from are not set",
                      config.checkpoint.dir.empty() ? "not set" : config.checkpoint.dir,
                      config.checkpoint.resume.empty() ? "" : config.checkpoint.resume));
    }
    int64_t max_shard_bytes = 0;
    try {
      max_shard_bytes = io::parse_shard_size(args.max_shard_size);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("--max-shard-size: {}", e.what()));
    }
    // Stored in float32 (the weights as trained) unless --export-dtype says otherwise; declared
    // as the dtype to serve in, the training precision's by default.
    const at::ScalarType declared = export_dtype(args.dtype, config.train.precision);
    const at::ScalarType stored = args.dtype.empty() ? at::kFloat : declared;
    // The model's family writes it (models/registry.h): one model.safetensors, or shards.
    const models::HfExport out = models::export_hf(config.model.name, *loaded.model, dir,
                                                   max_shard_bytes, loaded.read, stored);
    const ServingFiles serving = write_serving_files(config, dir, declared);
    const std::string weights = out.files.size() == 1
                                    ? out.files.front()
                                    : fmt::format("{} weight files", out.files.size() - 1);
    say(fmt::format("wrote {}/config.json and {} from {}, dtype {}{}, and {} (load with "
                    "transformers.pipeline(\"text-generation\", \"{}\"))",
                    dir, weights, loaded.weights, models::hf_dtype_name(declared),
                    stored == declared ? "" : " (stored as float32)", serving_note(serving), dir));
    return kExitOk;
  });
}

int run_export_peft(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& dir, bool force) {
  if (other_rank()) return kExitOk;
  return guarded("in --export-peft", [&] {
    const config::Config config = config::load_config(config_path, overrides);
    refuse_to_overwrite("--export-peft", dir, force);
    use_device(c10::Device(c10::kCPU), config.memory, 0);  // exported from the CPU
    const Loaded loaded = load_model(config, "--export-peft");
    const auto* adapters = models::as<models::Adapters>(*loaded.model);
    if (adapters == nullptr || !adapters->has_adapters()) {
      throw std::invalid_argument(
          "--export-peft: the config trains no adapters (set model.lora_rank, as the run that "
          "made the checkpoint did)");
    }
    if (loaded.weights.rfind("checkpoint ", 0) != 0) {
      throw std::invalid_argument(fmt::format(
          "--export-peft: no adapters to export: no checkpoint in checkpoint.dir ({}) or "
          "checkpoint.resume ({}){}",
          config.checkpoint.dir.empty() ? "not set" : config.checkpoint.dir,
          config.checkpoint.resume.empty() ? "not set" : config.checkpoint.resume,
          config.model.lora_init_from.empty() ? "" : " (model.lora_init_from is already one)"));
    }
    // lm/lora.h: PEFT's adapter_config.json and adapter_model.safetensors, the base by a name
    // that resolves from any directory; the tokenizer beside them (launcher/serving_files.h).
    const std::string base = peft_base_name(config.model.init_from);
    adapters->export_peft(dir, base);
    const ServingFiles tokenizer = write_tokenizer_files(config, dir);
    say(fmt::format(
        "wrote {}/adapter_config.json and {}/adapter_model.safetensors from {}{} "
        "(load with peft.PeftModel.from_pretrained(base, \"{}\") over the base {})",
        dir, dir, loaded.weights,
        tokenizer.tokenizer.empty() ? "" : ", and the tokenizer from " + tokenizer.tokenizer, dir,
        base.empty() ? "the config builds" : base));
    return kExitOk;
  });
}

int run_consolidate(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& step_dir, bool force) {
  if (other_rank()) return kExitOk;
  return guarded("in --consolidate", [&] {
    config::load_config(config_path, overrides);  // the command line is checked as for training
    std::string dir = step_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (!checkpoint::is_sharded_checkpoint(dir)) {
      throw checkpoint::CheckpointError(
          fmt::format("--consolidate: {} is not a sharded checkpoint (no {} in it)", dir,
                      io::kShardManifestName));
    }
    // Every file verified, then one tensor at a time (checkpoint/sharded.h).
    const std::string path = dir + ".safetensors";
    refuse_to_overwrite("--consolidate", path, force);
    const checkpoint::CheckpointMeta meta = checkpoint::consolidate_sharded_checkpoint(dir, path);
    say(fmt::format("wrote {} ({} steps done, written by {} rank(s)) from {}", path, meta.step,
                    meta.world_size, dir));
    return kExitOk;
  });
}

}  // namespace launcher
