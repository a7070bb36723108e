// Every configuration key, declared once: its type, default, range and a one-line description.
// This table is the single source of defaults (the structs' initialisers are only zero values).

#include "launcher/config_schema.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>

#include "memory/allocator_guard.h"
#include "models/gpt/gpt.h"
#include "models/registry.h"
#include "train/loss_scaler.h"

namespace launcher::schema {
namespace {

std::string kind_of(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "no value";
  return fmt::format("'{}'", node.Scalar());
}

const std::string& scalar(const YAML::Node& node, const char* expected) {
  if (!node.IsScalar()) throw ValueError(fmt::format("expected {}, got {}", expected, kind_of(node)));
  return node.Scalar();
}

int64_t parse_int(const YAML::Node& node) {
  const std::string& s = scalar(node, "an integer");
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) throw ValueError(fmt::format("'{}' is out of range", s));
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw ValueError(fmt::format("expected an integer, got '{}'", s));
  }
  return v;
}

double parse_real(const YAML::Node& node) {
  const std::string& s = scalar(node, "a number");
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    throw ValueError(fmt::format("expected a number, got '{}'", s));
  }
  return v;
}

// Accessors name a field of Config; `const_cast` lets one accessor serve get and set.
template <class T>
using Access = T& (*)(Config&);

template <class T>
T& field(Access<T> access, const Config& c) {
  return access(const_cast<Config&>(c));
}

// `k` with defaults of its own for some models (KeyDef::model_defaults).
KeyDef for_models(KeyDef k, std::vector<std::pair<std::string, std::string>> defaults) {
  k.model_defaults = std::move(defaults);
  return k;
}

KeyDef integer(std::string path, Access<int64_t> access, std::string def, int64_t lo, int64_t hi,
               std::string description) {
  const bool required = def.empty();
  return {std::move(path), "integer", std::move(def),
          hi == std::numeric_limits<int64_t>::max() ? fmt::format(">= {}", lo)
                                                    : fmt::format("{} .. {}", lo, hi),
          std::move(description), required,
          [=](Config& c, const YAML::Node& n) {
            const int64_t v = parse_int(n);
            if (v < lo || v > hi) {
              throw ValueError(hi == std::numeric_limits<int64_t>::max()
                                   ? fmt::format("{} is out of range: must be >= {}", v, lo)
                                   : fmt::format("{} is out of range: must be in {} .. {}", v, lo, hi));
            }
            access(c) = v;
          },
          [=](const Config& c) { return std::to_string(field(access, c)); }};
}

KeyDef seed(std::string path, Access<uint64_t> access, std::string def, std::string description) {
  return {std::move(path), "integer", std::move(def), "0 .. 2^63-1", std::move(description), false,
          [=](Config& c, const YAML::Node& n) {
            const int64_t v = parse_int(n);
            if (v < 0) throw ValueError(fmt::format("{} is out of range: must be >= 0", v));
            access(c) = static_cast<uint64_t>(v);
          },
          [=](const Config& c) { return std::to_string(field(access, c)); }};
}

// A real number in [lo, hi], or (lo, hi] with `lo_open`, or [lo, hi) with `hi_open`.
KeyDef real(std::string path, Access<double> access, std::string def, double lo, double hi,
            bool lo_open, bool hi_open, std::string description) {
  const std::string range = fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo,
                                        std::isinf(hi) ? "inf" : fmt::format("{}", hi),
                                        hi_open || std::isinf(hi) ? ")" : "]");
  return {std::move(path), "number", std::move(def), range, std::move(description), false,
          [=](Config& c, const YAML::Node& n) {
            const double v = parse_real(n);
            const bool below = lo_open ? v <= lo : v < lo;
            const bool above = hi_open ? v >= hi : v > hi;
            if (below || above) {
              throw ValueError(fmt::format("{} is out of range: must be in {}", v, range));
            }
            access(c) = v;
          },
          [=](const Config& c) { return fmt::format("{}", field(access, c)); }};
}

// A string, written back quoted where YAML needs it (spaces, '#', ':', '~', ...).
std::string yaml_string(const std::string& value) {
  YAML::Emitter out;
  out << YAML::DoubleQuoted << value;
  return out.c_str();
}

KeyDef text(std::string path, Access<std::string> access, std::string def,
            std::string description) {
  return {std::move(path), "string", def.empty() ? "\"\"" : std::move(def), "", std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            access(c) = n.IsNull() ? std::string() : scalar(n, "a string");
          },
          [=](const Config& c) { return yaml_string(field(access, c)); }};
}

// The position of `node`'s value among `options`; a ValueError naming them otherwise.
size_t choice_index(const YAML::Node& node, const std::vector<std::string>& options) {
  const std::string& v = scalar(node, "one of the choices");
  const auto it = std::find(options.begin(), options.end(), v);
  if (it == options.end()) {
    throw ValueError(fmt::format("'{}' is not one of: {}", v, fmt::join(options, ", ")));
  }
  return static_cast<size_t>(it - options.begin());
}

// A choice kept as a string: a name from an open set (a registry's models, datasets, presets),
// which the registry looks up once, or a launcher key read once at start-up (train.device,
// ddp.backend, log.level).
KeyDef choice(std::string path, Access<std::string> access, std::string def,
              std::vector<std::string> options, std::string description) {
  const bool required = def.empty();
  return {std::move(path), "choice", std::move(def), fmt::format("{}", fmt::join(options, " | ")),
          std::move(description), required,
          [=](Config& c, const YAML::Node& n) { access(c) = options[choice_index(n, options)]; },
          [=](const Config& c) { return field(access, c); }};
}

// The enum type a FIELD accessor names.
template <class Get>
using FieldType = std::remove_cvref_t<std::invoke_result_t<Get, Config&>>;

// A closed choice, stored as an enum whose value indexes `names` (the names the option struct
// declares beside the enum): parsed here once, printed back by name.
template <class Get, size_t N>
KeyDef enum_choice(std::string path, Get access, std::string def,
                   const std::array<const char*, N>& names, std::string description) {
  using E = FieldType<Get>;
  const std::vector<std::string> options(names.begin(), names.end());
  return {std::move(path), "choice", std::move(def), fmt::format("{}", fmt::join(options, " | ")),
          std::move(description), false,
          [=](Config& c, const YAML::Node& n) { access(c) = static_cast<E>(choice_index(n, options)); },
          [=](const Config& c) {
            return options.at(static_cast<size_t>(access(const_cast<Config&>(c))));
          }};
}

KeyDef boolean(std::string path, Access<bool> access, std::string def, std::string description) {
  return {std::move(path), "boolean", std::move(def), "true | false", std::move(description), false,
          [=](Config& c, const YAML::Node& n) {
            const std::string& v = scalar(n, "true or false");
            if (v == "true" || v == "True" || v == "yes") {
              access(c) = true;
            } else if (v == "false" || v == "False" || v == "no") {
              access(c) = false;
            } else {
              throw ValueError(fmt::format("expected true or false, got '{}'", v));
            }
          },
          [=](const Config& c) { return std::string(field(access, c) ? "true" : "false"); }};
}

// A list of closed choices, e.g. [halve_micro_batch, uncache_embeddings], stored as enums like
// enum_choice's; [] is allowed.
template <class Get, size_t N>
KeyDef enum_list(std::string path, Get access, std::string def,
                 const std::array<const char*, N>& names, std::string description) {
  using E = typename FieldType<Get>::value_type;
  const std::vector<std::string> options(names.begin(), names.end());
  return {std::move(path), "list", std::move(def), fmt::format("of: {}", fmt::join(options, ", ")),
          std::move(description), false,
          [=](Config& c, const YAML::Node& n) {
            if (!n.IsSequence()) {
              throw ValueError(fmt::format("expected a list like [{}], got {}", options[0], kind_of(n)));
            }
            std::vector<E> values;
            for (const auto& item : n) values.push_back(static_cast<E>(choice_index(item, options)));
            access(c) = std::move(values);
          },
          [=](const Config& c) {
            std::vector<std::string> chosen;
            for (const E v : access(const_cast<Config&>(c))) chosen.push_back(options.at(static_cast<size_t>(v)));
            return fmt::format("[{}]", fmt::join(chosen, ", "));
          }};
}

// A list of strings, e.g. [temperature, load]; [] is allowed.
KeyDef text_list(std::string path, Access<std::vector<std::string>> access, std::string def,
                 std::string description) {
  return {std::move(path), "list", std::move(def), "of strings", std::move(description), false,
          [=](Config& c, const YAML::Node& n) {
            if (!n.IsSequence()) {
              throw ValueError(fmt::format("expected a list like [a, b], got {}", kind_of(n)));
            }
            std::vector<std::string> values;
            for (const auto& item : n) values.push_back(scalar(item, "a string"));
            access(c) = std::move(values);
          },
          [=](const Config& c) {
            std::vector<std::string> quoted;
            for (const auto& v : field(access, c)) quoted.push_back(yaml_string(v));
            return fmt::format("[{}]", fmt::join(quoted, ", "));
          }};
}

// A string checked by `validate` (which throws std::invalid_argument with the reason).
KeyDef checked_text(std::string path, Access<std::string> access, std::string description,
                    std::function<void(const std::string&)> validate) {
  const std::string key_path = path;
  KeyDef key = text(std::move(path), access, "", std::move(description));
  auto set = key.set;
  key.set = [=](Config& c, const YAML::Node& n) {
    set(c, n);
    try {
      validate(access(c));
    } catch (const std::invalid_argument& e) {
      // The validator may name the key itself; the loader adds it anyway.
      std::string why = e.what();
      const std::string prefix = key_path + ": ";
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      throw ValueError(why);
    }
  };
  return key;
}

// A positive integer, or `auto` (stored as 0).
KeyDef integer_or_auto(std::string path, Access<int64_t> access, std::string def,
                       std::string description) {
  return {std::move(path), "integer | auto", std::move(def), ">= 1 or auto", std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            if (n.IsScalar() && n.Scalar() == "auto") {
              access(c) = 0;
              return;
            }
            int64_t v = 0;
            try {
              v = parse_int(n);
            } catch (const ValueError&) {
              throw ValueError(fmt::format("expected a positive integer or 'auto', got {}", kind_of(n)));
            }
            if (v < 1) throw ValueError(fmt::format("{} is out of range: must be >= 1 or 'auto'", v));
            access(c) = v;
          },
          [=](const Config& c) {
            return field(access, c) == 0 ? std::string("auto") : std::to_string(field(access, c));
          }};
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

#define FIELD(member) [](Config& c) -> auto& { return c.member; }

std::vector<KeyDef> declare() {
  return {
      choice("model.name", FIELD(model.name), "", models::model_names(), "model to train, from the model zoo"),
      integer("model.hidden_dim", FIELD(model.hidden_dim), "256", 1, 1 << 20, "width of each hidden layer"),
      integer("model.depth", FIELD(model.depth), "2", 0, 256, "number of hidden layers"),
      integer("model.embedding_dim", FIELD(model.embedding_dim), "64", 1, 1 << 16, "recommender: user and item vector size (also the text encoder's output)"),
      integer("model.encoder_dim", FIELD(model.encoder_dim), "64", 1, 1 << 16, "recommender: width of the frozen text encoder"),
      integer("model.encoder_layers", FIELD(model.encoder_layers), "2", 0, 128, "recommender: transformer blocks of the text encoder"),
      integer("model.encoder_heads", FIELD(model.encoder_heads), "4", 1, 256, "recommender: attention heads (must divide model.encoder_dim)"),
      integer("model.text_len", FIELD(model.text_len), "0", 0, 1 << 16, "recommender: text encoder positions (0: data.text_len)"),
      text("model.encoder_weights", FIELD(model.encoder_weights), "", "recommender: safetensors file with the text encoder's weights (empty: seeded random)"),
      for_models(choice("model.preset", FIELD(model.preset), "gpt2", models::preset_names(), "gpt, llama: dimensions to start from (llama's default: llama-tiny); each of model.num_layers, heads, d_model (llama: kv_heads, head_dim, intermediate_size, rope_*, rms_norm_eps) overrides its own"), {{"llama", "llama-tiny"}}),
      for_models(integer("model.num_layers", FIELD(model.num_layers), "0", 0, 1024, "gpt: transformer blocks (0: the preset's); sequence: LSTM layers or transformer blocks (default 2)"), {{"sequence", "2"}}),
      for_models(integer("model.heads", FIELD(model.heads), "0", 0, 1024, "gpt, sequence transformer: attention heads, dividing model.d_model (gpt 0: the preset's; sequence default 4)"), {{"sequence", "4"}}),
      for_models(integer("model.d_model", FIELD(model.d_model), "0", 0, 1 << 16, "gpt, sequence transformer: width (gpt 0: the preset's; sequence default 64)"), {{"sequence", "64"}}),
      integer("model.context", FIELD(model.context), "0", 0, 1 << 20, "gpt: positions the model holds (0: data.context)"),
      real("model.dropout", FIELD(model.dropout), "0.0", 0.0, 1.0, false, true, "gpt, sequence: dropout probability"),
      text("model.init_from", FIELD(model.init_from), "", "gpt: start from these weights: a Hugging Face GPT-2 directory (config.json + model.safetensors), a model.safetensors file, or a trainer checkpoint (weights only: a fresh optimizer at step 1); llama: a Hugging Face Llama directory (config.json + model.safetensors, or a sharded model.safetensors.index.json and its shards); its dimensions replace the preset's, keys set here must agree; ignored when resuming from a checkpoint"),
      boolean("model.checkpoint_activations", FIELD(model.checkpoint_activations), "false", "gpt: recompute each block in backward instead of keeping its activations"),
      integer("model.kv_heads", FIELD(model.kv_heads), "0", 0, 1024, "llama: key/value heads, dividing model.heads (fewer: grouped-query attention; 0: the preset's)"),
      integer("model.head_dim", FIELD(model.head_dim), "0", 0, 1 << 12, "llama: width of each attention head, even (0: the preset's, else model.d_model / model.heads)"),
      integer("model.intermediate_size", FIELD(model.intermediate_size), "0", 0, 1 << 20, "llama: hidden size of the SwiGLU MLP (0: the preset's)"),
      real("model.rms_norm_eps", FIELD(model.rms_norm_eps), "0.0", 0.0, 1.0, false, true, "llama: RMSNorm epsilon (0: the preset's, 1e-5)"),
      real("model.rope_theta", FIELD(model.rope_theta), "0.0", 0.0, kInf, false, true, "llama: rotary embedding base (0: the preset's: 10000, llama-3.2-1b 500000)"),
      choice("model.rope_scaling", FIELD(model.rope_scaling), "auto", {"auto", "none", "llama3"}, "llama: rotary frequency scaling (llama3: Llama 3.1's, with model.rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_context; auto: the preset's)"),
      real("model.rope_factor", FIELD(model.rope_factor), "0.0", 0.0, kInf, false, true, "llama, rope_scaling llama3: how much long wavelengths are slowed (0: the preset's, else 8)"),
      real("model.rope_low_freq_factor", FIELD(model.rope_low_freq_factor), "0.0", 0.0, kInf, false, true, "llama, rope_scaling llama3: wavelengths above rope_original_context / this are slowed (0: the preset's, else 1)"),
      real("model.rope_high_freq_factor", FIELD(model.rope_high_freq_factor), "0.0", 0.0, kInf, false, true, "llama, rope_scaling llama3: wavelengths below rope_original_context / this are kept (0: the preset's, else 4)"),
      integer("model.rope_original_context", FIELD(model.rope_original_context), "0", 0, 1 << 24, "llama, rope_scaling llama3: the context the model was first trained at (0: the preset's, else 8192)"),
      boolean("model.attention_bias", FIELD(model.attention_bias), "false", "llama: biases on the query/key/value and output projections"),
      boolean("model.mlp_bias", FIELD(model.mlp_bias), "false", "llama: biases on the MLP's projections"),
      boolean("model.tie_embeddings", FIELD(model.tie_embeddings), "true", "llama: the output layer is the token embedding (false: a separate lm_head)"),
      enum_choice("model.cell", FIELD(model.cell), "lstm", models::kSequenceCellNames, "sequence: the encoder over the window"),
      integer("model.base_channels", FIELD(model.base_channels), "64", 1, 4096, "cnn: feature channels of the residual blocks"),
      integer("model.num_blocks", FIELD(model.num_blocks), "8", 0, 1024, "cnn: residual blocks"),
      enum_choice("model.loss", FIELD(model.loss), "l1", models::kCnnLossNames, "cnn: loss against the clean image"),

      choice("data.dataset", FIELD(data.dataset), "synthetic", data::dataset_names(), "dataset to train on"),
      text("data.path", FIELD(data.path), "", "movielens: directory with ratings.dat and movies.dat; tokens: a .bin shard or a directory of them (training: files without 'val' in the name); csv: a .csv file; images: a directory of .png files"),
      text("data.val_path", FIELD(data.val_path), "", "tokens: validation shard(s) (empty: the files in data.path with 'val' in the name); images: a directory of validation .png files (empty: data.val_fraction of data.path)"),
      integer("data.context", FIELD(data.context), "256", 1, 1 << 20, "tokens: positions per sample (each reads context + 1 tokens)"),
      integer("data.vocab_size", FIELD(data.vocab_size), "50257", 1, 1 << 30, "tokens: token ids must be below this (50257: GPT-2 BPE; 256: bytes)"),
      choice("data.tokenizer", FIELD(data.tokenizer), "auto", {"auto", "bytes", "gpt2"}, "tokens: the encoding of the ids, for --generate and train.sample_every (auto: bytes when data.vocab_size <= 256, gpt2 when it is 50257)"),
      text_list("data.features", FIELD(data.features), "[]", "csv: input columns by header name (empty: every column whose first value is a number, the targets' past values included)"),
      text_list("data.targets", FIELD(data.targets), "[]", "csv: predicted columns by header name"),
      integer("data.window", FIELD(data.window), "48", 1, 1 << 20, "csv: time steps the model reads"),
      integer("data.horizon", FIELD(data.horizon), "1", 1, 1 << 20, "csv: time steps the model predicts"),
      real("data.val_fraction", FIELD(data.val_fraction), "0.1", 0.0, 1.0, false, false, "csv: the last fraction of rows held out for validation (normalisation uses the rest); images: of files, when data.val_path is empty"),
      integer("data.patch_size", FIELD(data.patch_size), "64", 4, 1 << 16, "images: side of the clean target crop, in pixels (a multiple of data.scale)"),
      integer("data.scale", FIELD(data.scale), "1", 1, 4, "images: 1 denoises; 2 or 4 super-resolves (inputs downscaled by it)"),
      real("data.noise_std", FIELD(data.noise_std), "0.1", 0.0, 1.0, false, false, "images: std of Gaussian noise added to inputs (pixel values in [0, 1])"),
      integer("data.crops_per_image", FIELD(data.crops_per_image), "16", 1, 1 << 20, "images: random crops per image per epoch"),
      integer("data.workers", FIELD(data.workers), "2", 0, 256, "loader threads reading ahead (0: read in the training thread)"),
      integer("data.prefetch", FIELD(data.prefetch), "2", 1, 1024, "steps read ahead of the one training"),
      integer("data.inject_read_delay_ms", FIELD(data.inject_read_delay_ms), "0", 0, 600000, "test hook: every read of a step's samples sleeps this long (a slow file system)"),
      integer("data.text_len", FIELD(data.text_len), "64", 1, 1 << 16, "movielens: bytes of item text (title | genres) per item"),
      integer("data.negatives", FIELD(data.negatives), "8", 1, 1000, "movielens: samples per training interaction per epoch, each with its own random negative item"),
      integer("data.num_samples", FIELD(data.num_samples), "16384", 1, 1LL << 40, "samples in the synthetic dataset"),
      integer("data.input_dim", FIELD(data.input_dim), "32", 1, 1 << 20, "features per synthetic sample"),
      integer("data.num_classes", FIELD(data.num_classes), "10", 2, 1 << 20, "classes of the synthetic task"),
      integer("data.teacher_hidden", FIELD(data.teacher_hidden), "64", 1, 1 << 20, "width of the random teacher that labels synthetic data"),
      real("data.label_noise", FIELD(data.label_noise), "0.0", 0.0, 1.0, false, false, "fraction of synthetic labels replaced at random"),
      seed("data.seed", FIELD(data.seed), "1234", "seed of the synthetic data, MovieLens negatives, image crops and noise"),

      choice("train.device", FIELD(train.device), "auto", {"auto", "cpu", "cuda"}, "auto: a GPU per rank where GPUs are visible, else CPU"),
      integer("train.global_batch_size", FIELD(train.global_batch_size), "", 1, 1LL << 31, "samples per optimizer step across all ranks"),
      integer_or_auto("train.micro_batch_size", FIELD(train.micro_batch_size), "auto", "samples per forward/backward on a rank (auto: the largest that fits memory.target_fraction, at most the per-rank batch)"),
      integer("train.steps", FIELD(train.steps), "100", 1, kMax, "optimizer steps to train"),
      real("train.lr", FIELD(train.lr), "0.001", 0.0, 10.0, true, false, "peak learning rate (AdamW)"),
      real("train.min_lr_ratio", FIELD(train.min_lr_ratio), "0.1", 0.0, 1.0, false, false, "final learning rate as a fraction of the peak (cosine decay)"),
      integer("train.warmup_steps", FIELD(train.warmup_steps), "10", 0, kMax, "steps of linear warmup"),
      real("train.weight_decay", FIELD(train.weight_decay), "0.01", 0.0, 10.0, false, false, "AdamW decoupled weight decay"),
      real("train.beta1", FIELD(train.beta1), "0.9", 0.0, 1.0, false, true, "AdamW beta1"),
      real("train.beta2", FIELD(train.beta2), "0.999", 0.0, 1.0, false, true, "AdamW beta2"),
      real("train.eps", FIELD(train.eps), "1e-08", 0.0, 1.0, true, false, "AdamW epsilon"),
      real("train.grad_clip", FIELD(train.grad_clip), "1.0", 0.0, kInf, false, true, "clip the global gradient norm to this (0: no clipping)"),
      seed("train.seed", FIELD(train.seed), "42", "seed of initialisation and data order"),
      integer("train.threads", FIELD(train.threads), "0", 0, 4096, "CPU threads per rank (0: the rank's share of the node's cores, binding the rank to them where the launcher bound it to fewer; set: the launcher's binding stands)"),
      integer("train.eval_every", FIELD(train.eval_every), "0", 0, kMax, "log validation metrics every N steps (0: after the last step only): the loss on the validation split (tokens, csv, images; PSNR too for images), HR@10 and NDCG@10 (movielens)"),
      enum_choice("train.precision", FIELD(train.precision), "fp32", train::kPrecisionNames, "bf16 / fp16: forward and loss under autocast (bfloat16 / float16 matmuls and convolutions); parameters, gradients, all-reduce and AdamW stay fp32; fp16 adds dynamic loss scaling"),
      real("train.loss_scale", FIELD(train.loss_scale), "65536", 1.0, 1e30, false, false, "fp16: initial loss scale"),
      real("train.loss_scale_growth", FIELD(train.loss_scale_growth), "2.0", 1.0, 1e6, false, false, "fp16: factor the scale grows by after train.loss_scale_interval finite steps in a row"),
      real("train.loss_scale_backoff", FIELD(train.loss_scale_backoff), "0.5", 0.0, 1.0, true, true, "fp16: factor the scale shrinks by after a step with a non-finite gradient (the step is skipped)"),
      integer("train.loss_scale_interval", FIELD(train.loss_scale_interval), "2000", 1, kMax, "fp16: finite steps in a row before the scale grows"),
      integer("train.max_skipped_steps", FIELD(train.max_skipped_steps), "50", 1, kMax, "fp16: this many skipped steps in a row end the job with a message"),
      checked_text("train.inject_nonfinite", FIELD(train.inject_nonfinite), "test hook: 'RANK:STEP[; RANK:STEP ...]' makes that rank's gradient non-finite at that step",
                   [](const std::string& v) { train::parse_nonfinite_injections(v); }),
      enum_choice("train.tf32", FIELD(train.tf32), "auto", train::kSwitchNames, "CUDA: TF32 matmuls and convolutions (auto: on Ampere and newer)"),
      boolean("train.cudnn_benchmark", FIELD(train.cudnn_benchmark), "false", "CUDA: let cuDNN time its algorithms for each new input shape (fixed shapes: faster)"),
      enum_choice("train.channels_last", FIELD(train.channels_last), "auto", train::kSwitchNames, "cnn: convolutions in channels-last (NHWC) memory format, which cuDNN's tensor-core kernels want (auto: on a GPU)"),
      boolean("train.cuda_graphs", FIELD(train.cuda_graphs), "false", "CUDA: capture forward + backward of a micro-batch as a CUDA graph after warm-up and replay it (launch overhead gone); falls back to eager, saying why, where capture cannot work"),
      real("train.peak_tflops", FIELD(train.peak_tflops), "0", 0.0, 1e6, false, false, "the device's dense peak TFLOP/s for MFU in the log (0: known GPUs by name: H100, H200, A100, L40S)"),
      integer("train.sample_every", FIELD(train.sample_every), "0", 0, kMax, "gpt: rank 0 logs a sample of generated text every N steps (fixed seed, eval mode; the training result is unchanged; 0: never)"),
      text("train.sample_prompt", FIELD(train.sample_prompt), "", "gpt: the samples' prompt (empty: the first 16 tokens of the first validation sequence, else training sequence)"),
      integer("train.sample_tokens", FIELD(train.sample_tokens), "64", 1, 1 << 20, "gpt: new tokens per sample (at most until model.context is full)"),
      integer("train.eval_samples", FIELD(train.eval_samples), "1024", 0, kMax, "validation samples evaluated each time, the first of the split (0: all)"),

      choice("ddp.backend", FIELD(ddp.backend), "auto", {"auto", "nccl", "mpi"}, "auto: NCCL for CUDA tensors, MPI for CPU"),
      real("ddp.timeout_s", FIELD(ddp.timeout_s), "600", 0.0, 7 * 86400.0, true, false, "deadline of every collective; past it the job ends instead of hanging"),
      real("ddp.first_bucket_mb", FIELD(ddp.first_bucket_mb), "1", 0.0, 65536.0, true, false, "cap of the first gradient bucket (MiB): small, so communication starts early"),
      real("ddp.bucket_mb", FIELD(ddp.bucket_mb), "25", 0.0, 65536.0, true, false, "cap of the other gradient buckets (MiB)"),
      boolean("ddp.find_unused_parameters", FIELD(ddp.find_unused_parameters), "false", "reduce parameters that got no gradient as zeros instead of stopping with an error"),
      enum_choice("ddp.reduce_dtype", FIELD(ddp.reduce_dtype), "fp32", ddp::kReduceDtypeNames, "dtype the gradient buckets are all-reduced in: bf16 halves the bytes on the wire (gradients, parameters and AdamW stay fp32; each bucket is cast for the reduction and back)"),
      enum_choice("ddp.shard", FIELD(ddp.shard), "none", ddp::kShardModeNames, "ZeRO sharding: optimizer keeps each rank's 1/N of the AdamW state (gradients reduce-scattered, parameters all-gathered); gradients also keeps only 1/N of the reduced gradients between steps"),
      enum_choice("ddp.mpi_progress", FIELD(ddp.mpi_progress), "caller", ddp::kMpiProgressModeNames, "what moves the MPI data plane's posted operations (gradient buckets on CPU) forward while backward computes: thread (a progress thread tests them; MPI_THREAD_MULTIPLE) or caller (only the training thread's own MPI calls, as Open MPI does by itself)"),
      real("ddp.mpi_poll_us", FIELD(ddp.mpi_poll_us), "50", 1.0, 1e6, false, false, "ddp.mpi_progress: thread: microseconds between the progress thread's rounds of MPI_Test while the training thread computes"),

      enum_list("memory.fallback", FIELD(memory.fallback), "[checkpoint_activations, halve_micro_batch, uncache_embeddings]", memory::kRungNames, "what to do, in order, when a rank runs out of memory in a step (shard_optimizer: become ddp.shard: optimizer in place; rungs a model or run cannot take are passed over)"),
      integer("memory.min_micro_batch", FIELD(memory.min_micro_batch), "1", 1, kMax, "halve_micro_batch stops at this micro-batch"),
      real("memory.fraction", FIELD(memory.fraction), "0", 0.0, 1.0, false, false, "CUDA: cap of each process's share of its device memory (0: no cap)"),
      real("memory.cpu_budget_mb", FIELD(memory.cpu_budget_mb), "0", 0.0, kInf, false, true, "CPU: tensor memory budget per rank in MiB; beyond it allocations fail as out of memory (0: none)"),
      checked_text("memory.inject_oom", FIELD(memory.inject_oom), "test hook: fail allocations at 'rank:step:phase[:times]; ...' (phase forward|backward|optimizer, times N|always)",
                   [](const std::string& v) { memory::parse_injections(v); }),
      integer("memory.check_every", FIELD(memory.check_every), "100", 0, kMax, "log every rank's memory every N steps (0: at start and end only)"),
      real("memory.target_fraction", FIELD(memory.target_fraction), "0.85", 0.0, 1.0, true, false, "train.micro_batch_size auto: the largest micro-batch whose estimated peak fits this share of the device (or CPU budget)"),
      real("memory.high_watermark", FIELD(memory.high_watermark), "0.92", 0.0, 1.0, true, false, "warn when a rank uses more than this share of its device (or CPU budget)"),

      text("checkpoint.dir", FIELD(checkpoint.dir), "", "directory for checkpoints (empty: none)"),
      integer("checkpoint.every", FIELD(checkpoint.every), "0", 0, kMax, "save every N steps (0: only at the end)"),
      integer("checkpoint.keep_last", FIELD(checkpoint.keep_last), "0", 0, kMax, "keep only the newest N periodic checkpoints, deleting older ones after a new one is complete (0: keep all)"),
      text("checkpoint.resume", FIELD(checkpoint.resume), "", "resume from this checkpoint file; 'auto': the newest in checkpoint.dir that verifies, if any (empty: start fresh)"),

      choice("log.level", FIELD(log.level), "info", {"trace", "debug", "info", "warn", "error"}, "log level of rank 0 (other ranks log warnings and errors)"),
      integer("log.every", FIELD(log.every), "10", 1, kMax, "log a step line every N steps"),
      text("log.metrics", FIELD(log.metrics), "", "JSON Lines file with a record per logged step and evaluation (empty: checkpoint.dir/metrics.jsonl when checkpoint.dir is set; off: none)"),
      enum_choice("log.progress", FIELD(log.progress), "auto", train::kProgressSettingNames, "rank 0's progress: bar (a live bar on stderr: steps, samples/s, loss, ETA; step lines still logged above it), lines (an ETA at the end of each step line), off (neither); auto: bar when stderr is a terminal, else lines (under mpirun a rank's stderr is a pipe: lines)"),
      text("log.tensorboard", FIELD(log.tensorboard), "", "directory for TensorBoard event files (rank 0 writes each logged step's and evaluation's numbers as scalars; created if missing; empty: none)"),
      text("log.profile", FIELD(log.profile), "", "directory for a profiler trace (Chrome/Perfetto JSON, trace_rank<R>.json per rank, as torch.profiler writes) of steps log.profile_from .. + log.profile_steps - 1; bench/profile_summary.py sums it per phase and operator (empty: none)"),
      integer("log.profile_from", FIELD(log.profile_from), "3", 1, kMax, "first step of the profiler trace (the first steps warm up allocators and caches)"),
      integer("log.profile_steps", FIELD(log.profile_steps), "5", 1, 10000, "number of steps in the profiler trace"),
  };
}

#undef FIELD

}  // namespace

const std::vector<KeyDef>& keys() {
  static const std::vector<KeyDef> table = declare();
  return table;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const auto& k : keys()) {
    std::string section = k.path.substr(0, k.path.find('.'));
    if (std::find(out.begin(), out.end(), section) == out.end()) out.push_back(section);
  }
  return out;
}

}  // namespace launcher::schema
