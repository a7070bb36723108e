// LoRA's options and an adapted layer, as the language-model base holds them (lm/causal_lm.h);
// what adds, exports and loads adapters is lm/lora.h.
#pragma once

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
};

// One adapted layer: its Hugging Face name, the projection it adds to, and the adapter.
struct LoraSite {
  std::string name;  // as named_parameters() spells its module: layers.0.self_attn.q_proj
  std::string base;  // the adapted weight's name: layers.0.self_attn.qkv_proj.weight
  std::shared_ptr<Projection> projection;
  std::shared_ptr<LoraAdapter> adapter;
};

}  // namespace models
