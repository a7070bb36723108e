#include "models/llama/llama_family.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <stdexcept>

#include "models/deferred_init.h"
#include "models/llama/hf_llama.h"
#include "models/llama/llama.h"

namespace models {
namespace {

// The preset with the keys the config sets (> 0, or a rope_scaling other than auto) over it.
LlamaOptions from_keys(const ModelOptions& o) {
  LlamaOptions l = llama_preset(o.preset);  // the schema's default for llama: llama-tiny
  l.num_layers = or_else(o.num_layers, l.num_layers);
  l.heads = or_else(o.heads, l.heads);
  l.d_model = or_else(o.d_model, l.d_model);
  l.kv_heads = or_else(o.kv_heads, l.kv_heads);
  l.head_dim = or_else(o.head_dim, l.head_dim);
  l.intermediate = or_else(o.intermediate_size, l.intermediate);
  l.rms_norm_eps = or_else(o.rms_norm_eps, l.rms_norm_eps);
  RopeOptions& r = l.rope;
  r.theta = or_else(o.rope_theta, r.theta);
  if (!o.rope_scaling.empty() && o.rope_scaling != "auto") r.scaling = o.rope_scaling;
  r.factor = or_else(o.rope_factor, r.factor);
  r.low_freq_factor = or_else(o.rope_low_freq_factor, r.low_freq_factor);
  r.high_freq_factor = or_else(o.rope_high_freq_factor, r.high_freq_factor);
  r.original_context = or_else(o.rope_original_context, r.original_context);
  l.attention_bias = o.attention_bias;
  l.mlp_bias = o.mlp_bias;
  l.tie_embeddings = o.tie_embeddings;
  return l;
}

std::shared_ptr<CausalLm> make_llama(const ModelOptions& o, const core::Shape& s) {
  require_token_data(s, "llama");
  LlamaOptions l = from_keys(o);
  l.vocab_size = s.vocab_size;
  l.context = o.context;  // 0: the file's (model.init_from), else the data's
  l.dropout = o.dropout;
  l.checkpoint_activations = o.checkpoint_activations;
  std::optional<LlamaInit> init;
  // Built without storage (ddp.shard: parameters): the weights are read later, by ranges.
  const bool deferred = DeferredInit::current() != nullptr;
  if (!o.init_from.empty()) {
    // The file's architecture wins over the preset's; dimension keys set here must agree.
    init = read_llama_init(o.init_from, /*weights=*/!deferred);
    apply_llama_init(
        *init, {o.num_layers, o.heads, o.kv_heads, o.head_dim, o.d_model, o.intermediate_size}, l);
  }
  if (l.context == 0) l.context = s.context;
  require_context_fits(s, l.context);
  auto llama = std::make_shared<Llama>(l);
  if (init) {
    if (deferred) {
      defer_llama_init(*init, *llama, llama->options());
    } else {
      load_llama_init(*init, *llama, llama->options());
    }
    const LlamaOptions& m = llama->options();
    spdlog::info("model.init_from: Hugging Face Llama {} ({} blocks, {} wide, {} heads over {} kv "
                 "heads of {}, MLP {}, {} positions)",
                 init->path, m.num_layers, m.d_model, m.heads, m.kv_heads, m.head_dim,
                 m.intermediate, m.context);
  }
  return llama;
}

}  // namespace

LmFamily llama_family() {
  return {.name = "llama",
          .presets = llama_preset_names(),
          .make = make_llama,
          .hf_class = "LlamaForCausalLM",
          .export_hf = [](Model& model, const std::string& dir, int64_t max_shard_bytes,
                          const ParameterReader& read) {
            Llama& llama = as_family<Llama>(model, "llama");
            return export_hf_llama(llama, llama.options(), dir, max_shard_bytes, read);
          }};
}

}  // namespace models
