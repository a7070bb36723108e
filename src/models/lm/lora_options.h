// LoRA's options and an adapted layer, as the language-model base holds them (lm/causal_lm.h);
// what adds, exports and loads adapters is lm/lora.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace models {

class LoraAdapter;
class Projection;

struct LoraOptions {
  int64_t rank = 0;
  double alpha = 0.0;
  double dropout = 0.0;
  std::vector<std::string> targets;  // Hugging Face names; empty: the family's default
  bool rslora = false;  // rank-stabilised LoRA: scale alpha / sqrt(rank) (PEFT's use_rslora)
};

// The adapters' scale, as PEFT computes it: alpha / rank, or alpha / sqrt(rank) with rsLoRA.
inline double lora_scale(const LoraOptions& o) {
  const auto r = static_cast<double>(o.rank);
  return o.alpha / (o.rslora ? std::sqrt(r) : r);
}

// One adapted layer: its Hugging Face name, the projection it adds to, and the adapter.
struct LoraSite {
  std::string name;  // as named_parameters() spells its module: layers.0.self_attn.q_proj
  std::string base;  // the adapted weight's name: layers.0.self_attn.qkv_proj.weight
  std::shared_ptr<Projection> projection;
  std::shared_ptr<LoraAdapter> adapter;
};

}  // namespace models
