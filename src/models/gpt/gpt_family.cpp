#include "models/gpt/gpt_family.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <stdexcept>

#include "models/deferred_init.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf_gpt2.h"

namespace models {
namespace {

// Gpt(g), naming model.init_from's file when the dimensions it gave do not fit (Gpt names only
// the model keys).
std::shared_ptr<Gpt> build_gpt(const GptOptions& g, const std::optional<GptInit>& init) {
  try {
    return std::make_shared<Gpt>(g);
  } catch (const std::invalid_argument& e) {
    if (!init) throw;
    throw std::invalid_argument(fmt::format(
        "model.init_from: {}: {} (the file gives {} blocks, {} heads, {} wide, {} positions)",
        init->config_file.empty() ? init->file : init->config_file, e.what(), g.num_layers, g.heads,
        g.d_model, g.context));
  }
}

std::shared_ptr<CausalLm> make_gpt(const ModelOptions& o, const core::Shape& s) {
  require_token_data(s, "gpt");
  GptOptions g = gpt_preset(o.preset);  // the schema's default: gpt2
  g.vocab_size = s.vocab_size;
  g.padded_vocab_size = 0;  // rounded up to a multiple of 64
  g.num_layers = or_else(o.num_layers, g.num_layers);
  g.heads = or_else(o.heads, g.heads);
  g.d_model = or_else(o.d_model, g.d_model);
  g.context = or_else(o.context, s.context);
  std::optional<GptInit> init;
  // Built without storage (ddp.shard: parameters): the weights are read later, by ranges.
  const bool deferred = DeferredInit::current() != nullptr;
  if (!o.init_from.empty()) {
    // The file's dimensions win over the preset's; keys the config sets must agree.
    init = read_gpt_init(o.init_from, /*weights=*/!deferred);
    apply_init_dims(*init, {o.num_layers, o.heads, o.d_model, o.context, 0, 0}, g);
  }
  g.dropout = o.dropout;
  g.checkpoint_activations = o.checkpoint_activations;
  auto gpt = build_gpt(g, init);
  if (init) {
    if (deferred) {
      defer_gpt_init(*init, *gpt);
    } else {
      load_gpt_init(*init, *gpt);
    }
    spdlog::info("model.init_from: weights of {} {} ({} blocks, {} heads, {} wide, {} "
                 "positions)",
                 init->kind, init->file, g.num_layers, g.heads, g.d_model, g.context);
  }
  return gpt;
}

}  // namespace

LmFamily gpt_family() {
  return {.name = "gpt",
          .presets = gpt_preset_names(),
          .make = make_gpt,
          .hf_class = "GPT2LMHeadModel",
          .export_hf = [](Model& model, const std::string& dir, int64_t max_shard_bytes,
                          const ParameterReader& read, at::ScalarType dtype) {
            return export_hf_gpt2(as_family<Gpt>(model, "gpt"), dir, max_shard_bytes, read, dtype);
          }};
}

}  // namespace models
