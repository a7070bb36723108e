#include "models/llama/llama_family.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <stdexcept>
#include <utility>

#include "models/deferred_init.h"
#include "models/llama/llama.h"
#include "models/lm/presets.h"

namespace models {
namespace {

// The preset with the keys the config sets (> 0, or a choice other than auto) over it.
LlamaOptions from_keys(const ModelOptions& o, const LlamaDialect& dialect,
                       const std::vector<LlamaPreset>& presets) {
  // The schema's default preset is the family's first (models::default_presets).
  LlamaOptions l = options_of(find_preset(presets, o.preset, dialect.family), dialect.family);
  l.num_layers = or_else(o.num_layers, l.num_layers);
  l.heads = or_else(o.heads, l.heads);
  l.d_model = or_else(o.d_model, l.d_model);
  l.kv_heads = or_else(o.kv_heads, l.kv_heads);
  l.head_dim = or_else(o.head_dim, l.head_dim);
  l.intermediate = or_else(o.intermediate_size, l.intermediate);
  l.rms_norm_eps = or_else(o.rms_norm_eps, l.rms_norm_eps);
  l.sliding_window = or_else(o.sliding_window, l.sliding_window);
  RopeOptions& r = l.rope;
  r.theta = or_else(o.rope_theta, r.theta);
  if (!o.rope_scaling.empty() && o.rope_scaling != "auto") r.scaling = o.rope_scaling;
  r.factor = or_else(o.rope_factor, r.factor);
  r.low_freq_factor = or_else(o.rope_low_freq_factor, r.low_freq_factor);
  r.high_freq_factor = or_else(o.rope_high_freq_factor, r.high_freq_factor);
  r.original_context = or_else(o.rope_original_context, r.original_context);
  l.attention_bias = o.attention_bias;
  l.mlp_bias = o.mlp_bias;
  if (o.tie_embeddings != "auto") l.tie_embeddings = o.tie_embeddings == "true";
  if (dialect.fix) dialect.fix(l);
  return l;
}

std::shared_ptr<CausalLm> make_llama(const ModelOptions& o, const core::Shape& s,
                                     const LlamaDialect& dialect,
                                     const std::vector<LlamaPreset>& presets) {
  require_token_data(s, dialect.family);
  LlamaOptions l = from_keys(o, dialect, presets);
  l.vocab_size = s.vocab_size;
  l.context = o.context;  // 0: the file's (model.init_from), else the data's
  l.dropout = o.dropout;
  l.checkpoint_activations = o.checkpoint_activations;
  std::optional<LlamaInit> init;
  // Built without storage (ddp.shard: parameters): the weights are read later, by ranges.
  const bool deferred = DeferredInit::current() != nullptr;
  if (!o.init_from.empty()) {
    // The file's architecture wins over the preset's; dimension keys set here must agree.
    init = read_llama_init(o.init_from, /*weights=*/!deferred, dialect);
    apply_llama_init(*init,
                     {o.num_layers, o.heads, o.kv_heads, o.head_dim, o.d_model, o.intermediate_size,
                      o.sliding_window},
                     l);
  }
  if (l.context == 0) l.context = s.context;
  auto llama = std::make_shared<Llama>(l);
  if (init) {
    if (deferred) {
      defer_llama_init(*init, *llama, llama->options());
    } else {
      load_llama_init(*init, *llama, llama->options());
    }
    const LlamaOptions& m = llama->options();
    spdlog::info("model.init_from: Hugging Face {} {} ({} blocks, {} wide, {} heads over {} kv "
                 "heads of {}, MLP {}, {} positions{})",
                 dialect.title, init->path, m.num_layers, m.d_model, m.heads, m.kv_heads,
                 m.head_dim, m.intermediate, m.context,
                 m.sliding_window > 0 ? fmt::format(", window {}", m.sliding_window) : "");
  }
  return llama;
}

}  // namespace

LmFamily llama_block_family(const LlamaDialect& dialect, std::vector<LlamaPreset> presets) {
  const std::vector<std::string> names = preset_names_of(presets);
  return {.name = dialect.family,
          .presets = names,
          .make = [dialect, presets](const ModelOptions& o, const core::Shape& s)
              -> std::shared_ptr<CausalLm> { return make_llama(o, s, dialect, presets); },
          .hf_class = dialect.hf_class,
          .export_hf =
              [dialect](Model& model, const std::string& dir, int64_t max_shard_bytes,
                        const ParameterReader& read, at::ScalarType dtype) {
                Llama& llama = as_family<Llama>(model, dialect.family);
                return export_hf_llama(llama, llama.options(), dir, max_shard_bytes, read, dialect,
                                       dtype);
              }};
}

LmFamily llama_family() { return llama_block_family(llama_dialect(), llama_presets()); }

}  // namespace models
