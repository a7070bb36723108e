#include "models/gpt/gpt.h"

#include "models/layers.h"
#include "models/gpt/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

namespace models {
namespace {

constexpr double kLayerNormEps = 1e-5;  // GPT-2's
constexpr double kInitStd = 0.02;       // GPT-2's
constexpr int64_t kVocabMultiple = 64;  // padded_vocab_size 0: vocab_size rounded up to this

struct Preset {
  const char* name;
  int64_t num_layers, heads, d_model, context, vocab_size;
};
constexpr Preset kPresets[] = {
    {"gpt2", 12, 12, 768, 1024, 50257},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257},
    {"tiny", 2, 4, 64, 64, 256},
};

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("gpt: " + message);
}

void require_positive(const char* key, int64_t value) {
  require(value > 0, fmt::format("{} must be positive, got {}", key, value));
}

// Note [Checkpointed blocks]
// A checkpointed block runs forward without recording a graph and keeps only its input. Backward
// re-runs it with grad enabled on a detached copy of the input and calls backward on that
// recomputation re-entrantly (as PyTorch's reentrant torch.utils.checkpoint does), so the block's
// parameters accumulate into .grad through their own AccumulateGrad nodes, and their
// post-accumulate-grad hooks (the Reducer's bucket triggers) fire once per backward, exactly as
// without checkpointing. The parameters are reached through the recomputation, never passed as
// inputs of the function: as inputs, autograd would produce their gradients a second time.
// The recomputation sees what the first run saw: the RNG state (CPU default generator, and the
// CUDA one of the input's device), so dropout draws the same masks, and the autocast state, so
// it computes in the same precision (backward runs outside the trainer's autocast scope). The
// generators are put back afterwards: checkpointing leaves the random stream as it found it.

// What a checkpointed segment recomputes. Held in the autograd context (as a capsule: the one
// IValue that holds an arbitrary C++ object), so the graph keeps the block, and with it its
// parameters, alive until backward has run.
struct Segment final : torch::CustomClassHolder {
  explicit Segment(std::function<at::Tensor(const at::Tensor&)> f) : run(std::move(f)) {}
  std::function<at::Tensor(const at::Tensor&)> run;
};

// The random and autocast state a segment ran under (Note [Checkpointed blocks]).
struct RunState {
  at::Tensor cpu_rng;
  at::Tensor cuda_rng;  // defined when the input is on a CUDA device
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;

  static RunState capture(const at::Tensor& x) {
    RunState s;
    s.cpu_rng = get(cpu_generator());
    if (x.is_cuda()) s.cuda_rng = get(cuda_generator(x.device()));
    s.autocast = at::autocast::is_autocast_enabled(x.device().type());
    s.autocast_dtype = at::autocast::get_autocast_dtype(x.device().type());
    return s;
  }

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["cpu_rng"] = cpu_rng;
    if (cuda_rng.defined()) ctx->saved_data["cuda_rng"] = cuda_rng;
    ctx->saved_data["autocast"] = autocast;
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(autocast_dtype);
  }

  static RunState load(torch::autograd::AutogradContext* ctx) {
    RunState s;
    s.cpu_rng = ctx->saved_data.at("cpu_rng").toTensor();
    if (ctx->saved_data.count("cuda_rng")) s.cuda_rng = ctx->saved_data.at("cuda_rng").toTensor();
    s.autocast = ctx->saved_data.at("autocast").toBool();
    s.autocast_dtype = static_cast<at::ScalarType>(ctx->saved_data.at("autocast_dtype").toInt());
    return s;
  }

  static at::Generator cpu_generator() { return at::globalContext().defaultGenerator(at::kCPU); }
  static at::Generator cuda_generator(c10::Device device) {
    return at::globalContext().defaultGenerator(device);
  }
  static at::Tensor get(at::Generator gen) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
  static void set(at::Generator gen, const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
};

// Puts a RunState in place for its lifetime, then restores what was there (RNG and autocast).
class RunStateScope {
 public:
  RunStateScope(const RunState& s, c10::Device device) : device_(device) {
    now_cpu_ = RunState::get(RunState::cpu_generator());
    RunState::set(RunState::cpu_generator(), s.cpu_rng);
    if (s.cuda_rng.defined()) {
      now_cuda_ = RunState::get(RunState::cuda_generator(device));
      RunState::set(RunState::cuda_generator(device), s.cuda_rng);
    }
    const auto type = device.type();
    was_autocast_ = at::autocast::is_autocast_enabled(type);
    was_dtype_ = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_dtype(type, s.autocast_dtype);
    at::autocast::set_autocast_enabled(type, s.autocast);
    if (s.autocast) at::autocast::increment_nesting();
    autocast_ = s.autocast;
  }
  ~RunStateScope() {
    const auto type = device_.type();
    // As the trainer's AutocastScope: the outermost scope drops the cached casts of the weights.
    if (autocast_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type, was_autocast_);
    at::autocast::set_autocast_dtype(type, was_dtype_);
    RunState::set(RunState::cpu_generator(), now_cpu_);
    if (now_cuda_.defined()) RunState::set(RunState::cuda_generator(device_), now_cuda_);
  }
  RunStateScope(const RunStateScope&) = delete;
  RunStateScope& operator=(const RunStateScope&) = delete;

 private:
  c10::Device device_;
  at::Tensor now_cpu_, now_cuda_;
  bool autocast_ = false, was_autocast_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

struct Checkpoint final : torch::autograd::Function<Checkpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::intrusive_ptr<Segment>& segment) {
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    RunState::capture(x).save(ctx);
    ctx->save_for_backward({x});
    at::NoGradGuard no_grad;  // no graph, so no saved activations (apply disables grad too)
    return segment->run(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto segment = c10::static_intrusive_pointer_cast<Segment>(
        ctx->saved_data.at("segment").toCapsule());
    const at::Tensor x = ctx->get_saved_variables().at(0).detach().requires_grad_(true);
    at::Tensor y;
    {
      RunStateScope same_as_forward(RunState::load(ctx), x.device());
      at::AutoGradMode enable_grad(true);
      y = segment->run(x);
    }
    // Re-entrant: accumulates into the block's parameters' .grad (and x's), firing their hooks.
    torch::autograd::backward({y}, {grads.at(0)});
    return {x.grad(), at::Tensor()};
  }
};

// x -> f(x), recomputed in backward instead of keeping f's activations.
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> f, const at::Tensor& x) {
  return Checkpoint::apply(x, c10::make_intrusive<Segment>(std::move(f)));
}

// One pre-LayerNorm block, registered under h.{i}: ln_1, attn.c_attn, attn.c_proj, ln_2,
// mlp.c_fc, mlp.c_proj.
class GptBlock final : public torch::nn::Module {
 public:
  GptBlock(int64_t d, int64_t heads) : d_(d), heads_(heads) {
    const auto layer_norm = [d] {
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(kLayerNormEps));
    };
    // In GPT-2's order (named_parameters() follows registration).
    ln_1_ = register_module("ln_1", layer_norm());
    auto attn = register_module("attn", std::make_shared<torch::nn::Module>());
    c_attn_ = attn->register_module("c_attn", torch::nn::Linear(d, 3 * d));
    attn_proj_ = attn->register_module("c_proj", torch::nn::Linear(d, d));
    ln_2_ = register_module("ln_2", layer_norm());
    auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
    c_fc_ = mlp->register_module("c_fc", torch::nn::Linear(d, 4 * d));
    mlp_proj_ = mlp->register_module("c_proj", torch::nn::Linear(4 * d, d));
  }

  // GPT-2's initialisation; the residual output projections scaled by 1 / sqrt(2 num_layers).
  void init(double residual_std) {
    at::NoGradGuard no_grad;
    for (auto* linear : {&c_attn_, &attn_proj_, &c_fc_, &mlp_proj_}) {
      const bool residual = linear == &attn_proj_ || linear == &mlp_proj_;
      (*linear)->weight.normal_(0.0, residual ? residual_std : kInitStd);
      (*linear)->bias.zero_();
    }
  }

  // x [n, T, d] -> x + attn(ln_1(x)) -> + mlp(ln_2(.)), dropout p on the attention
  // probabilities and on each branch's output. With `past_k` / `past_v` (incremental decoding),
  // x holds the positions after the ones cached there: its queries see the cached keys and values
  // too, and the cache is extended by its own.
  at::Tensor forward(const at::Tensor& x, double p, at::Tensor* past_k = nullptr,
                     at::Tensor* past_v = nullptr) {
    const int64_t n = x.size(0), t = x.size(1);
    const auto split_heads = [&](const at::Tensor& z) {
      return z.view({n, t, heads_, d_ / heads_}).transpose(1, 2);  // [n, heads, T, d / heads]
    };
    const auto qkv = linear(c_attn_, ln_1_->forward(x)).split(d_, -1);
    at::Tensor k = split_heads(qkv[1]), v = split_heads(qkv[2]);
    std::optional<at::Tensor> mask;
    bool causal = true;
    if (past_k != nullptr) {
      if (past_k->defined()) {
        // is_causal aligns the mask to the top left, which is wrong once keys outnumber
        // queries: query i (position past + i) sees keys 0 .. past + i.
        const int64_t past = past_k->size(2);
        k = at::cat({*past_k, k}, 2);
        v = at::cat({*past_v, v}, 2);
        causal = false;
        if (t > 1) mask = at::ones({t, past + t}, x.options().dtype(at::kBool)).tril(past);
      }
      *past_k = k;
      *past_v = v;
    }
    const at::Tensor a = at::scaled_dot_product_attention(split_heads(qkv[0]), k, v, mask, p,
                                                          causal);
    at::Tensor h = x + at::dropout(linear(attn_proj_, a.transpose(1, 2).reshape({n, t, d_})), p,
                                   p > 0);
    const at::Tensor m = gelu(linear(c_fc_, ln_2_->forward(h)), GeluApprox::kTanh);
    return h + at::dropout(linear(mlp_proj_, m), p, p > 0);
  }

 private:
  int64_t d_, heads_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  torch::nn::Linear c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
};

}  // namespace

struct Gpt::Layers {
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<std::shared_ptr<GptBlock>> blocks;  // also registered as h.{i}
  torch::nn::LayerNorm ln_f{nullptr};
};

GptOptions gpt_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    GptOptions o;
    o.num_layers = p.num_layers;
    o.heads = p.heads;
    o.d_model = p.d_model;
    o.context = p.context;
    o.vocab_size = p.vocab_size;
    return o;
  }
  throw std::invalid_argument(fmt::format("model.preset: unknown preset '{}'; known presets: {}",
                                          name, fmt::join(gpt_preset_names(), ", ")));
}

std::vector<std::string> gpt_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Gpt::Gpt(const GptOptions& o)
    : options_(o), own_chunk_rows_(o.loss_chunk_rows), layers_(std::make_unique<Layers>()) {
  require_positive("model.num_layers", o.num_layers);
  require_positive("model.heads", o.heads);
  require_positive("model.d_model", o.d_model);
  require_positive("model.context", o.context);
  require_positive("data.vocab_size", o.vocab_size);
  require(o.d_model % o.heads == 0,
          fmt::format("model.heads ({}) must divide model.d_model ({})", o.heads, o.d_model));
  require(o.dropout >= 0.0 && o.dropout < 1.0,
          fmt::format("model.dropout must be in [0, 1), got {}", o.dropout));
  if (options_.padded_vocab_size == 0) {
    options_.padded_vocab_size =
        (o.vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  }
  require(options_.padded_vocab_size >= o.vocab_size,
          fmt::format("padded_vocab_size ({}) must be at least data.vocab_size ({})",
                      options_.padded_vocab_size, o.vocab_size));

  const int64_t d = o.d_model;
  Layers& l = *layers_;
  l.wte = register_module("wte", torch::nn::Embedding(options_.padded_vocab_size, d));
  l.wpe = register_module("wpe", torch::nn::Embedding(o.context, d));
  auto h = register_module("h", torch::nn::ModuleList());
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(o.num_layers));
  for (int64_t i = 0; i < o.num_layers; ++i) {
    auto block = std::make_shared<GptBlock>(d, o.heads);
    block->init(residual_std);
    h->push_back(block);
    l.blocks.push_back(std::move(block));
  }
  l.ln_f = register_module("ln_f", torch::nn::LayerNorm(
                                       torch::nn::LayerNormOptions({d}).eps(kLayerNormEps)));
  at::NoGradGuard no_grad;
  l.wte->weight.normal_(0.0, kInitStd);
  l.wpe->weight.normal_(0.0, kInitStd);
}

Gpt::~Gpt() = default;

at::Tensor Gpt::forward(const at::Tensor& tokens) {
  return at::linear(hidden(tokens), layers_->wte->weight);  // tied output projection
}

at::Tensor Gpt::hidden(const at::Tensor& tokens) {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}",
                      c10::toString(tokens.scalar_type()), tokens.sizes()));
  const int64_t t = tokens.size(1);
  require(t >= 1 && t <= options_.context,
          fmt::format("samples of {} tokens; 1 to model.context = {} are allowed", t,
                      options_.context));
  Layers& l = *layers_;
  const double p = is_training() ? options_.dropout : 0.0;
  at::Tensor x = l.wte->forward(tokens) + l.wpe->forward(at::arange(t, tokens.options()));
  x = at::dropout(x, p, p > 0);
  // Only when a graph is being recorded: evaluation (no grad) has no activations to keep.
  const bool recompute = options_.checkpoint_activations && at::GradMode::is_enabled();
  for (const auto& block : l.blocks) {
    if (recompute) {
      x = checkpoint([block, p](const at::Tensor& in) { return block->forward(in, p); }, x);
    } else {
      x = block->forward(x, p);
    }
  }
  return l.ln_f->forward(x);
}

at::Tensor Gpt::forward_cached(const at::Tensor& tokens, KvCache& cache) {
  require(tokens.dim() == 2 && tokens.scalar_type() == at::kLong,
          fmt::format("tokens must be int64 [n, T], got {} {}",
                      c10::toString(tokens.scalar_type()), tokens.sizes()));
  Layers& l = *layers_;
  if (cache.keys.empty()) {
    cache.keys.resize(l.blocks.size());
    cache.values.resize(l.blocks.size());
  }
  require(cache.keys.size() == l.blocks.size(), "a KV cache of another model");
  const int64_t past = cache.length(), t = tokens.size(1);
  require(t >= 1 && past + t <= options_.context,
          fmt::format("{} cached + {} new positions; model.context = {} are allowed", past, t,
                      options_.context));
  // The position embedding continues where the cache ends.
  at::Tensor x = l.wte->forward(tokens) + l.wpe->forward(at::arange(past, past + t, tokens.options()));
  for (size_t i = 0; i < l.blocks.size(); ++i) {
    x = l.blocks[i]->forward(x, 0.0, &cache.keys[i], &cache.values[i]);
  }
  return at::linear(l.ln_f->forward(x), l.wte->weight);
}

at::Tensor Gpt::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  require(targets.sizes() == tokens.sizes() && targets.scalar_type() == at::kLong,
          fmt::format("targets must be int64 {} like the tokens, got {} {}", tokens.sizes(),
                      c10::toString(targets.scalar_type()), targets.sizes()));
  // The output layer and the loss in chunks of positions (Note [Chunked output layer]): the
  // [positions, vocab] logits are never whole. The padded rows of wte are masked out there.
  const at::Tensor h = hidden(tokens);
  return linear_cross_entropy(h.reshape({-1, options_.d_model}), layers_->wte->weight,
                              targets.reshape({-1}), options_.vocab_size,
                              options_.loss_chunk_rows);
}

int64_t Gpt::loss_chunk_rows(int64_t rows) const {
  return linear_cross_entropy_chunk_rows(rows, options_.padded_vocab_size, options_.loss_chunk_rows);
}

void Gpt::set_loss_chunk_rows(int64_t rows) {
  options_.loss_chunk_rows = rows > 0 ? rows : own_chunk_rows_;
}

bool Gpt::set_checkpoint_activations(bool on) {
  options_.checkpoint_activations = on;
  return true;
}

double Gpt::flops_per_token(int64_t positions) const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  n -= layers_->wpe->weight.numel();
  return 6.0 * static_cast<double>(n) +
         12.0 * static_cast<double>(options_.num_layers * options_.d_model * positions);
}

}  // namespace models
