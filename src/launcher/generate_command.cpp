#include "launcher/generate_command.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "launcher/exit_codes.h"
#include "launcher/launch.h"
#include "models/gpt/generate.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf_gpt2.h"
#include "models/language_model.h"
#include "models/llama/hf_llama.h"
#include "models/llama/llama.h"
#include "models/safetensors_shards.h"
#include "models/registry.h"
#include "train/checkpoint.h"

namespace launcher {
namespace {

constexpr int64_t kSamplePromptTokens = 16;  // train.sample_prompt empty: from the data

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
// Throws what load_config, create_model and the checkpoint reader throw.
Loaded load_model(const Config& config, const char* command) {
  if (config.model.name != "gpt" && config.model.name != "llama") {
    throw std::invalid_argument(fmt::format("{} needs a language model (model.name: gpt or llama); this "
                                            "config has model.name: {}", command, config.model.name));
  }
  core::Shape shape;
  shape.vocab_size = config.data.vocab_size;
  shape.context = config.data.context;
  at::manual_seed(config.train.seed);  // untrained weights: the ones training would start from
  Loaded out;
  out.model = std::dynamic_pointer_cast<models::LanguageModel>(models::create_model(config.model, shape));
  const auto& ckpt = config.checkpoint;
  std::optional<train::Checkpoint> found;
  if (!ckpt.resume.empty() && ckpt.resume != "auto") {
    found = train::read_checkpoint(ckpt.resume);
  } else if (!ckpt.dir.empty()) {
    std::vector<std::string> skipped;
    train::Checkpoint c;
    if (!train::newest_good_checkpoint(ckpt.dir, &skipped, &c).empty()) found = std::move(c);
    for (const auto& why : skipped) say(fmt::format("passing over a damaged checkpoint: {}", why));
  }
  if (found) {
    train::check_compatible(*found, *out.model);
    train::apply_model_state(*found, *out.model);
    out.weights = fmt::format("checkpoint {} ({} steps done)", found->path, found->meta.step);
  } else if (!config.model.init_from.empty()) {
    out.weights = fmt::format("model.init_from {}", config.model.init_from);
  }
  return out;
}

c10::Device inference_device(const Config& config) {
  const bool cuda = config.train.device == "cuda" || (config.train.device == "auto" && at::hasCUDA());
  return cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

// Runs `body`, turning user mistakes into a message and exit code 2.
template <class Fn>
int guarded(Fn&& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    say(fmt::format("error: {}", e.what()));
  } catch (const train::CheckpointError& e) {
    say(fmt::format("error: {}", e.what()));
  } catch (const std::invalid_argument& e) {  // data::DataError too
    say(fmt::format("error: {}", e.what()));
  } catch (const c10::Error& e) {
    say(fmt::format("error: {}", e.what_without_backtrace()));
    return kExitFailure;
  } catch (const std::exception& e) {
    say(fmt::format("error: {}", e.what()));
    return kExitFailure;
  }
  return kExitUsage;
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

// One line of log: control characters escaped (a sample may hold newlines and tabs).
std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<data::Tokenizer> tokenizer_for(const data::DataOptions& d) {
  std::string name = d.tokenizer;
  if (name == "auto" || name.empty()) {
    if (d.vocab_size <= 256) {
      name = "bytes";
    } else if (d.vocab_size == 50257) {
      name = "gpt2";
    } else {
      throw std::invalid_argument(fmt::format(
          "data.tokenizer: auto knows no encoding with data.vocab_size = {} (bytes: up to 256, "
          "gpt2: 50257); set data.tokenizer", d.vocab_size));
    }
  }
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::make_tokenizer(name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("data.tokenizer: {}", e.what()));
  }
  if (tokenizer->vocab_size() > d.vocab_size) {
    throw std::invalid_argument(fmt::format(
        "data.tokenizer: {} ids go up to {}, above data.vocab_size = {}", name,
        tokenizer->vocab_size() - 1, d.vocab_size));
  }
  return tokenizer;
}

int run_generate(const std::string& config_path, const std::vector<std::string>& overrides,
                 const GenerateArgs& args) {
  if (other_rank()) return kExitOk;
  return guarded([&] {
    const Config config = load_config(config_path, overrides);
    const auto tokenizer = tokenizer_for(config.data);
    Loaded loaded = load_model(config, "--generate");
    if (loaded.weights.empty()) {
      say("warning: no checkpoint (checkpoint.resume, checkpoint.dir) and no model.init_from: "
          "sampling from the untrained model");
    } else {
      say(fmt::format("weights: {}", loaded.weights));
    }
    const c10::Device device = inference_device(config);
    loaded.model->to(device);
    models::SamplingOptions o;
    o.max_new_tokens = args.max_new_tokens;
    o.temperature = args.temperature;
    o.top_k = args.top_k;
    o.seed = args.seed;
    o.stop_id = tokenizer->end_of_text();
    std::vector<int64_t> prompt = tokenizer->encode(args.prompt);
    if (prompt.empty() && tokenizer->end_of_text()) prompt.push_back(*tokenizer->end_of_text());
    if (prompt.empty()) throw std::invalid_argument("--generate: the prompt is empty");
    const auto ids = models::generate(*loaded.model, prompt, o);
    const int64_t room = loaded.model->context() - static_cast<int64_t>(prompt.size());
    if (args.max_new_tokens > room) {
      say(fmt::format("the model holds {} positions: {} new tokens after the prompt's {}",
                      loaded.model->context(), room, prompt.size()));
    }
    // The prompt as given, then the continuation's text (an end-of-text id is not spelled).
    std::vector<int64_t> spelled = ids;
    if (o.stop_id && !spelled.empty() && spelled.back() == *o.stop_id) spelled.pop_back();
    fmt::print("{}{}\n", args.prompt, tokenizer->decode(spelled));
    std::fflush(stdout);
    return kExitOk;
  });
}

int run_export_hf(const std::string& config_path, const std::vector<std::string>& overrides,
                  const std::string& dir, const std::string& max_shard_size) {
  if (other_rank()) return kExitOk;
  return guarded([&] {
    const Config config = load_config(config_path, overrides);
    const Loaded loaded = load_model(config, "--export-hf");
    if (loaded.weights.empty()) {
      throw std::invalid_argument(fmt::format(
          "--export-hf: no weights to export: no checkpoint in checkpoint.dir ({}), "
          "checkpoint.resume ({}) and model.init_from are not set",
          config.checkpoint.dir.empty() ? "not set" : config.checkpoint.dir,
          config.checkpoint.resume.empty() ? "" : config.checkpoint.resume));
    }
    int64_t max_shard_bytes = 0;
    try {
      max_shard_bytes = models::parse_shard_size(max_shard_size);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("--max-shard-size: {}", e.what()));
    }
    if (auto* llama = dynamic_cast<models::Llama*>(loaded.model.get())) {
      const auto files = models::export_hf_llama(*llama, llama->options(), dir, max_shard_bytes);
      say(fmt::format("wrote {}/config.json and {} weight file{} from {} (load with "
                      "transformers.LlamaForCausalLM.from_pretrained(\"{}\"))", dir,
                      files.size() == 1 ? 1 : files.size() - 1, files.size() == 1 ? "" : "s",
                      loaded.weights, dir));
      return kExitOk;
    }
    models::export_hf_gpt2(dynamic_cast<models::Gpt&>(*loaded.model), dir);
    say(fmt::format("wrote {}/config.json and {}/model.safetensors from {} (load with "
                    "transformers.GPT2LMHeadModel.from_pretrained(\"{}\"))",
                    dir, dir, loaded.weights, dir));
    return kExitOk;
  });
}

std::function<std::string()> make_training_sampler(std::shared_ptr<models::Model> model,
                                                   const Config& config,
                                                   const data::Dataset& dataset) {
  auto gpt = std::dynamic_pointer_cast<models::LanguageModel>(model);
  if (!gpt) {
    throw std::invalid_argument(fmt::format(
        "train.sample_every: samples need a language model (model.name: gpt or llama), not {}",
        config.model.name));
  }
  std::shared_ptr<const data::Tokenizer> tokenizer = tokenizer_for(config.data);
  std::vector<int64_t> prompt = tokenizer->encode(config.train.sample_prompt);
  if (prompt.empty()) {
    const auto val = dataset.validation();
    const data::Dataset& from = val && val->size() > 0 ? *val : dataset;
    const at::Tensor first = from.get(at::zeros({1}, at::kLong)).inputs[0];
    const int64_t n = std::min<int64_t>(kSamplePromptTokens, first.size(0));
    const at::Tensor head = first.narrow(0, 0, n).to(at::kLong).contiguous();
    prompt.assign(head.data_ptr<int64_t>(), head.data_ptr<int64_t>() + n);
  }
  models::SamplingOptions o;
  o.max_new_tokens = config.train.sample_tokens;
  o.temperature = 0.8;
  o.top_k = 200;
  o.seed = config.train.seed;
  o.stop_id = tokenizer->end_of_text();
  // Checked now: a prompt that fills the context is a config mistake, not a failure at step N.
  if (static_cast<int64_t>(prompt.size()) >= gpt->context()) {
    throw std::invalid_argument(fmt::format(
        "train.sample_prompt: {} tokens fill model.context = {}", prompt.size(),
        gpt->context()));
  }
  return [gpt, tokenizer, prompt, o] {
    const auto ids = models::generate(*gpt, prompt, o);
    return one_line(tokenizer->decode(prompt) + " | " + tokenizer->decode(ids));
  };
}

}  // namespace launcher
