// LoRA: low-rank adapters on a language model's projections, the base frozen (docs/DESIGN.md,
// "One language-model base"; docs/language-models.md, "LoRA").
//
//   model.lora_rank r > 0 turns it on; model.lora_targets names the adapted layers by their
//   Hugging Face names (llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
//   gpt: c_attn, c_proj, c_fc; [] the attention projections), model.lora_alpha / r the scale
//   (model.lora_rslora: alpha / sqrt(r), PEFT's use_rslora), model.lora_dropout the dropout on
//   the adapters' input.
//
// Each adapted layer W gets W x + scale * B A dropout(x) (models/block.h, LoraAdapter); llama's
// q_proj, k_proj and v_proj adapt their rows of the fused qkv_proj. The adapters are the model's
// only parameters: every weight of the base becomes a buffer (no gradient, not in parameters()),
// so the optimizer, the reducer's buckets and shards, the memory plan and the checkpoint's
// moments hold the adapters alone, by the mechanism a frozen block already uses. Their names are
// PEFT's without its prefix: layers.{i}.self_attn.q_proj.lora_A.weight, h.{i}.attn.c_attn.lora_B.
// weight; each is in its block's parameter unit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/lm/lora_options.h"
#include "models/model.h"

namespace torch::nn {
class Module;
}

namespace models {

class CausalLm;

// The model keys' LoRA options; rank 0: off. std::invalid_argument naming model.lora_rank when a
// LoRA key is set without a rank.
LoraOptions lora_options(const ModelOptions& options);

// Every parameter of `module` and below becomes a buffer of the same name (requires_grad false).
void freeze_parameters(torch::nn::Module& module);

// The base's weights by name with each adapter merged into its rows (W + scale B A), as float32
// on the CPU: what --export-hf writes of a model with adapters.
std::vector<std::pair<std::string, at::Tensor>> merged_weights(torch::nn::Module& model,
                                                               const std::vector<LoraSite>& sites);

// One weight of the base, `base` (the frozen buffer named `name`), with the adapters of `sites`
// on it merged in (W + scale B A), float32 on the CPU: merged_weights one tensor at a time, for
// the streamed export (lm/hf_ranges.h, export_reader). A weight without adapters comes back
// detached, float32, on the CPU, not copied when it already is.
at::Tensor merged_weight(const at::Tensor& base, const std::string& name,
                         const std::vector<LoraSite>& sites);

// The elements of `module`'s parameters (with adapters: the adapters') and of its buffers (with
// adapters: the frozen base).
int64_t parameter_count(torch::nn::Module& module);
int64_t buffer_count(torch::nn::Module& module);

// --export-peft DIR: DIR/adapter_config.json and DIR/adapter_model.safetensors as PEFT's
// save_pretrained writes a LoRA adapter (keys base_model.model.<the Hugging Face name>.lora_A.
// weight, float32; use_rslora as model.lora_rslora), for peft.PeftModel.from_pretrained over
// the base `base_path` names (--export-peft: a Hub id, or model.init_from's absolute path).
// Returns the two files. std::invalid_argument when `model` has no adapters,
// std::runtime_error naming a file that cannot be written.
std::vector<std::string> export_peft(const CausalLm& model, const std::string& dir,
                                     const std::string& base_path);

// model.lora_init_from DIR: copies a PEFT LoRA adapter (adapter_config.json,
// adapter_model.safetensors) into `model`'s adapters. std::invalid_argument naming the file and
// the key when it is not a LoRA adapter, sets a field of PEFT's that is not plain LoRA (use_dora,
// rank_pattern, alpha_pattern, ...: lora.cpp, refuse_variants), its rank, alpha, use_rslora or
// targets differ from model.lora_*, or a tensor is missing, extra or of another shape.
void load_peft(CausalLm& model, const std::string& dir);

// load_peft's first step: the adapter_config.json at `config_path` read and checked against the
// model's LoRA options, with load_peft's errors.
void check_peft_config(const LoraOptions& options, const std::string& config_path);

// The frozen base's hash (models::FrozenBase::base_hash, "crc32:xxxxxxxx"): zlib's CRC-32 of
// `init_from`/config.json when there is one, then each frozen buffer's name, shape and dtype in
// name order. Call after add_lora.
std::string base_hash(const CausalLm& model, const std::string& init_from);

// `model` with the adapters `options` names (lora_options; none when the rank is 0), the base
// frozen, the adapters of model.lora_init_from loaded, and the log line that says how many
// parameters train.
std::shared_ptr<CausalLm> with_lora(std::shared_ptr<CausalLm> model, const ModelOptions& options);

}  // namespace models
