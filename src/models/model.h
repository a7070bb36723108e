// Model: what the training loop needs of a network. Models know nothing of ranks or datasets:
// they take input tensors and give a loss (the mean over the batch).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace models {

// model.cell (sequence) and model.loss (cnn): choice keys, parsed once by the config loader; their
// names, as the config spells them, are indexed by the enum's value.
enum class SequenceCell { kLstm, kTransformer };
inline constexpr std::array<const char*, 2> kSequenceCellNames = {"lstm", "transformer"};
enum class CnnLoss { kL1, kMse };
inline constexpr std::array<const char*, 2> kCnnLossNames = {"l1", "mse"};

// The model section of the config (declared with defaults in config/schema_model.cpp; the
// initialisers here are only zero values).
struct ModelOptions {
  std::string name;
  int64_t hidden_dim = 0;  // width of each hidden layer (recommender: of the item tower)
  int64_t depth = 0;       // number of hidden layers (recommender: of the item tower)
  // recommender
  int64_t embedding_dim = 0;    // user and item vectors (and the text encoder's output)
  int64_t encoder_dim = 0;      // text encoder width
  int64_t encoder_layers = 0;   // text encoder blocks
  int64_t encoder_heads = 0;    // text encoder attention heads (divides encoder_dim)
  int64_t text_len = 0;         // text encoder positions; 0: the data's item text length
  std::string encoder_weights;  // safetensors file for the text encoder; empty: seeded random
  // gpt: a preset (gpt2, gpt2-medium, tiny) whose dimensions the keys below override when > 0
  std::string preset;
  int64_t num_layers = 0;  // gpt: blocks; sequence: LSTM layers or transformer blocks
  int64_t heads = 0;       // gpt, sequence transformer: attention heads (divides d_model)
  int64_t d_model = 0;     // gpt, sequence transformer: width
  int64_t context = 0;     // gpt: positions (0: the data's context)
  double dropout = 0.0;    // gpt, sequence: dropout probability
  bool checkpoint_activations = false;  // gpt: recompute each block in backward
  std::string init_from;  // gpt: weights to start from (models/gpt/hf_gpt2.h); empty: initialised
  // llama (models/llama/llama.h); 0 or "auto": the preset's (with model.init_from: the file's)
  int64_t kv_heads = 0;           // key/value heads, dividing heads
  int64_t head_dim = 0;           // per head
  int64_t intermediate_size = 0;  // the SwiGLU MLP's hidden size
  double rms_norm_eps = 0.0;
  double rope_theta = 0.0;
  std::string rope_scaling;  // auto | none | llama3
  double rope_factor = 0.0;  // llama3 scaling: models/rope.h
  double rope_low_freq_factor = 0.0;
  double rope_high_freq_factor = 0.0;
  int64_t rope_original_context = 0;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string tie_embeddings;  // auto (the preset's or the file's) | true | false
  int64_t sliding_window = 0;  // llama and kin: sliding-window attention (0: the preset's)
  // gpt, llama: LoRA adapters (models/lm/lora.h); rank 0: none
  int64_t lora_rank = 0;  // LoRA's rank: has_adapters() below
  double lora_alpha = 0.0;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_targets;  // Hugging Face names; empty: the attention projections
  std::string lora_init_from;             // a PEFT LoRA adapter directory to start from
  bool lora_rslora = false;               // scale alpha / sqrt(rank) (PEFT's use_rslora)
  // sequence
  SequenceCell cell{};  // lstm | transformer
  // cnn
  int64_t base_channels = 0;
  int64_t num_blocks = 0;
  CnnLoss loss{};  // cnn: l1 | mse

  // Whether the model built from these options carries LoRA adapters (model.lora_rank > 0): the
  // one answer before the build (after it: models::Adapters::has_adapters).
  bool has_adapters() const { return lora_rank > 0; }
};

// What every model has. Capabilities only some models have (embedding caches, item scores,
// activation checkpointing, channels-last, a chunked loss) are interfaces of their own in
// models/capabilities.h, which a model derives from besides Model.
struct DeferredRecord;  // models/deferred_init.h

class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;
  // The loss per target, in the unit of data::Dataset::target_count: the mean over the batch's
  // samples for most models; a token model's (gpt, llama) the mean over the target tokens it
  // counts (not core::kIgnoreTarget): their summed loss over max(their number, 1), so a batch
  // without one gives 0. The trainer weights it by the batch's share of the global batch's
  // targets (docs/DESIGN.md, "Global batch semantics").
  virtual at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;

  // Evaluation on held-out data: named sums over the batch, as 0-dim double tensors on the
  // model's device (e.g. {"loss", sum of per-sample losses}, {"psnr", sum of per-image PSNR}).
  // The trainer adds them over the validation split and every rank, then divides "loss" by the
  // number of targets (data::Dataset::target_count: the samples for most data, the target tokens
  // for token data) and every other sum by the number of samples. Called under no-grad in eval
  // mode. The default: the loss times the batch size (one target per sample).
  virtual std::vector<std::pair<std::string, at::Tensor>> eval_sums(const at::Tensor& inputs,
                                                                    const at::Tensor& targets) {
    return {{"loss", loss(inputs, targets).to(at::kDouble).mul(inputs.size(0))}};
  }

  // Floating-point operations of forward + backward per token for a sample of `positions`
  // tokens (token models; PaLM's estimate, appendix B: 6N + 12 L d T), for tokens/s and MFU in the
  // log. 0: not a token model, or no estimate.
  virtual double flops_per_token(int64_t positions) const { return 0; }

  // A model built inside a models::DeferredInit scope holds its parameters without storage, and
  // this record says how they get their values (models/deferred_init.h); null when built whole.
  const std::shared_ptr<DeferredRecord>& deferred_init() const { return deferred_; }
  void set_deferred_init(std::shared_ptr<DeferredRecord> record) { deferred_ = std::move(record); }

 private:
  std::shared_ptr<DeferredRecord> deferred_;
};

}  // namespace models
