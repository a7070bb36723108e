// LmShape: a decoder-only language model of the base (models/lm/causal_lm.h) as its dimensions
// alone, for planning without weights (--dry-run --plan-ranks: docs/DESIGN.md, "Planning without
// the device"): its parameters in registration order with their units (the bucket layout of every
// ddp.shard mode follows from them), and its activation memory computed from the shapes instead of
// probed, so that a plan of a 70B model takes seconds and a few MiB.
//
// Activations (Note [Activations from the shapes], lm_shape.cpp): what autograd saves per token in
// one block (its norms' inputs and outputs, the projections' outputs, the position scheme's and
// attention's saved tensors, the MLP's), times the blocks (or, with activation checkpointing, one
// d_model-wide input per block and one block recomputed), plus one block's gradients in flight,
// the embeddings' and the final norm's outputs; the chunked output layer's vocabulary-wide
// tensors per row of its chunk, and its weight's gradient, accumulated over the chunks, fixed.
// An estimate of the device's memory at `element_bytes` per activation (2 under bf16 and fp16
// autocast, 4 in fp32), checked against the CPU probe in tests/unit/lm_shape_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace models {

struct LmShape {
  int64_t vocab = 0;
  int64_t padded_vocab = 0;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t positions = 0;  // a learned position embedding's rows (gpt's wpe); 0: rotary (llama)
  bool swiglu = true;     // llama's gated MLP (SwiGLU, GeGLU) and RMSNorm; false: GPT-2's GELU MLP
                          // and LayerNorm
  bool attention_bias = false;  // the attention's projections have biases (gpt)
  bool qkv_bias = false;        // the query/key/value projection's alone (Qwen2)
  bool qk_norm = false;         // RMSNorms over each head of q and k (Qwen3)
  bool sandwich_norms = false;  // norms after the attention and the MLP too (Gemma 3)
  bool mlp_bias = false;        // the MLP's projections have biases (gpt)
  bool tied = false;            // the output layer is the token embedding
  std::string family;           // model.name: "gpt", "llama", "qwen3", ...
  // LoRA (models/lm/lora.h): rank 0 off; the adapted layers by their Hugging Face names (as
  // model.lora_targets, defaults applied). With adapters, parameters() lists the adapters alone
  // (what trains, shards and has optimizer state) and frozen() the base, which every rank holds
  // whole, except under ddp.shard: parameters, which shards it with its units.
  int64_t lora_rank = 0;
  std::vector<std::string> lora_targets;

  struct Parameter {
    std::string name;
    int64_t numel = 0;
    size_t unit = 0;  // 0 the embeddings, 1 .. layers the blocks, then the output unit
  };
  // In registration order, as the family registers them (named_parameters()): the base's, or
  // with LoRA the adapters'.
  std::vector<Parameter> parameters() const;
  // The elements of the base and the adapters together (what the log calls the model's size).
  int64_t parameter_count() const;
  // The frozen base's elements under LoRA (0 without adapters).
  int64_t frozen_count() const;
  // Under LoRA, the frozen base's parameters (their units as parameters()'); empty without.
  std::vector<Parameter> frozen() const;
  size_t units() const { return static_cast<size_t>(layers) + (tied ? 1 : 2); }

  struct Activations {
    int64_t fixed = 0;          // bytes whatever the micro-batch
    int64_t per_sample = 0;     // bytes per sample of `positions` tokens
    int64_t per_chunk_row = 0;  // the output layer's bytes per row of its chunk
  };
  Activations activations(int64_t positions, int64_t element_bytes, bool checkpointed) const;

  // The same shape ratio `factor` times as wide and as deep: d_model, the heads (kv heads keep
  // their group) and the MLP scaled by `factor` (d_model a multiple of head_dim, the MLP of 64),
  // the blocks too (at least one); vocabulary and positions kept.
  LmShape scaled(double factor) const;

  // With LoRA adapters (lora_rank > 0; ModelOptions::has_adapters).
  bool has_adapters() const { return lora_rank > 0; }
};

}  // namespace models
