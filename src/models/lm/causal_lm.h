// CausalLm: the base of the decoder-only language models (gpt: models/gpt/gpt.h, llama:
// models/llama/llama.h). It holds what they share, so that a feature for every language model is
// written once, here:
//
//   tokens [n, T] at positions P -> embed(tokens, P) (-> dropout where the family has it there)
//     -> the blocks (models/block.h; checkpointed per block when asked; a parameter unit each)
//     -> final_norm -> forward: logits = x @ output_weight()^T
//                      loss:    linear_cross_entropy(x, output_weight(), targets) in chunks of
//                               positions (Note [Chunked output layer]; the padded rows of the
//                               output weight are never a target and never predicted)
//   forward_cached: the same for positions past .. past + t - 1 of a KV cache (generation).
//
// A family's constructor registers its modules (in its Hugging Face order: named_parameters()
// follows registration), builds blocks_ with add_blocks, and says in CausalLmDims what the base
// needs; it implements the three parts that differ: embed, final_norm and output_weight.
//
// The loss counts the targets that are not core::kIgnoreTarget (masked tokens, a packed
// document's last position, padding): their summed cross-entropy over max(their number, 1),
// computed on the device; eval_sums' "loss" is that sum (in nats).
//
// Packed documents (PackedDocuments; models/documents.h): positions [n, T] reach embed() as they
// are (gpt's learned wpe takes them; llama's embed ignores them) and the blocks through
// BlockCall::documents (the rotary scheme takes them, attention is block-diagonal causal), so
// a document's logits are those it gets alone. Unpacked, positions are 0 .. T-1. blocks_ is the
// one list of blocks, for every family, whose projections adapters would wrap.
//
// Parameter units (ddp.shard: parameters): 0 the embeddings (CausalLmDims::embeddings), 1 .. L
// the blocks, then, for an untied output layer, one unit of what is left (the final norm and the
// output layer); tied, what is left joins unit 0, which the output layer enters again. Forward
// enters 0, 1, ..., L, then the output unit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/block.h"  // KvCache
#include "models/capabilities.h"
#include "models/documents.h"
#include "models/language_model.h"
#include "models/lm/hf_tensor.h"
#include "models/lm/lora_options.h"

namespace models {

// What the base needs of a family's resolved options.
struct CausalLmDims {
  std::string family;             // "gpt", "llama": the prefix of its errors
  int64_t vocab_size = 0;         // ids it predicts (targets are below it)
  int64_t padded_vocab_size = 0;  // rows of the output weight
  int64_t context = 0;            // positions it can see
  int64_t d_model = 0;
  int64_t attention_width = 0;     // heads x head size: the attention term of flops_per_token
  double dropout = 0.0;            // training mode only; in the blocks (models/block.h)
  bool embedding_dropout = false;  // also on the embeddings' output (GPT-2 has it there)
  bool checkpoint_activations = false;
  int64_t loss_chunk_rows = 0;  // positions per chunk of the output layer (0: the default)
  bool tied = false;            // the output layer is the token embedding
  // The names of the embedding modules (unit 0): "wte", "wpe"; "embed_tokens".
  std::vector<std::string> embeddings;
  std::string blocks;  // the name the blocks are registered under: "h", "layers"
  // LoRA (lm/lora.h): the Hugging Face names of q, k and v are slices of the fused projection
  // (llama's q_proj, k_proj, v_proj of qkv_proj), not the fused one (gpt's c_attn); the targets
  // of model.lora_targets: []; the prefix of the model's names in Hugging Face's format
  // ("transformer.", "model.").
  bool lora_split_qkv = false;
  std::vector<std::string> lora_default_targets;
  std::string hf_prefix;
  bool learned_positions = false;  // a position embedding of `context` rows (gpt's wpe)
};

// The rows of the embedding and the output layer for `vocab` ids when the options leave it to
// the model (padded_vocab_size 0): rounded up to a multiple of 64, a fast matmul width.
int64_t padded_vocab(int64_t vocab);

class CausalLm : public LanguageModel,
                 public ActivationCheckpointing,
                 public ChunkedLoss,
                 public ParameterUnits,
                 public PackedDocuments,
                 public HiddenMatrices,
                 public FrozenBase,
                 public Adapters,
                 public SequenceLogProbs,
                 public ShapePlanning {
 public:
  ~CausalLm() override;

  // logits [n, T, padded_vocab_size] for tokens int64 [n, T] (1 <= T <= context).
  at::Tensor forward(const at::Tensor& tokens) final;
  // Incremental decoding (LanguageModel): no dropout; the units entered as forward enters them.
  at::Tensor forward_cached(const at::Tensor& tokens, KvCache& cache) final;
  // Next-token cross-entropy per target; targets int64 of the tokens' shape, each below
  // vocab_size or core::kIgnoreTarget (skipped): the sum over the others / max(their number, 1).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) final;
  // {"loss", the summed cross-entropy over the targets that count} (Model::eval_sums).
  std::vector<std::pair<std::string, at::Tensor>> eval_sums(const at::Tensor& tokens,
                                                            const at::Tensor& targets) final;

  // Packed documents: the three above with positions int64 [n, T] (on the CPU or the model's
  // device; capabilities.h, PackedDocuments).
  at::Tensor forward_packed(const at::Tensor& tokens, const at::Tensor& positions) final;
  at::Tensor loss_packed(const at::Tensor& tokens, const at::Tensor& targets,
                         const at::Tensor& positions) final;
  std::vector<std::pair<std::string, at::Tensor>> eval_sums_packed(
      const at::Tensor& tokens, const at::Tensor& targets, const at::Tensor& positions) final;
  int64_t vocab_size() const final { return dims_.vocab_size; }
  int64_t context() const final { return dims_.context; }
  // SequenceLogProbs: the trunk, then the output layer over every position at once ([n, T,
  // vocab] logits: a preference batch's rows are a few sequences).
  at::Tensor sequence_logps(const at::Tensor& tokens, const at::Tensor& targets) final;

  // 6 N + 12 L A T (PaLM's estimate): N the parameters less the embeddings that are only looked
  // up (not also the output layer: gpt's wpe, an untied llama's embed_tokens), A the attention
  // width. The recomputation of checkpointing is not counted.
  double flops_per_token(int64_t positions) const final;

  void set_checkpoint_activations(bool on) final { dims_.checkpoint_activations = on; }
  bool checkpoint_activations() const final { return dims_.checkpoint_activations; }

  // Every position is a row of the chunked output layer.
  int64_t loss_rows(const at::Tensor& tokens) const final { return tokens.numel(); }
  int64_t loss_chunk_rows(int64_t rows) const final;
  void set_loss_chunk_rows(int64_t rows) final;

  LmShape lm_shape() const final;

  std::vector<std::vector<std::string>> parameter_units() const final;
  std::vector<std::vector<std::string>> frozen_units() const final;
  std::vector<size_t> unit_order() const final;
  void set_unit_gate(UnitGate* gate) final { gate_ = gate; }
  UnitGate* unit_gate() const final { return gate_; }

  // The blocks' 2-D weights (attention and MLP projections) as the family's Hugging Face map
  // (hf_map) stores them: one matrix per file tensor (llama's q_proj, k_proj and v_proj three row
  // ranges of qkv_proj; GPT-2's c_attn whole), in registration order.
  std::vector<HiddenMatrix> hidden_matrices() const final;
  // Hugging Face's tensors as rows of the parameters `shapes` lists (models/lm/hf_tensor.h; the
  // family's llama_hf_map or gpt_hf_map, with its files' prefix).
  virtual HfMap hf_map(const ParameterShapes& shapes) const = 0;
  // LoRA (lm/lora.h): freezes the base (its parameters become buffers) and adds the adapters
  // `options` names (rank > 0), in each block's parameter unit. Once, after the base's weights
  // are loaded. Throws std::invalid_argument naming the model.lora_* key.
  void add_lora(const LoraOptions& options);
  // The adapted layers, in order (empty without LoRA), and the options they were made with.
  const std::vector<LoraSite>& lora_sites() const { return lora_sites_; }
  const LoraOptions& lora_options() const { return lora_; }
  // Adapters: whether add_lora added any; export_peft is lm/lora.h's (defined in lora.cpp).
  bool has_adapters() const final { return !lora_sites_.empty(); }
  std::vector<std::string> export_peft(const std::string& dir, const std::string& base) const final;
  // FrozenBase: with adapters, the frozen base's weights (its parameters before add_lora) and
  // what set_base recorded of it; without, none and "".
  std::vector<std::string> frozen_buffer_names() const final { return frozen_; }
  std::string base_hash() const final { return base_hash_; }
  std::string base_path() const final { return base_path_; }
  void set_base(std::string path, std::string hash) {
    base_path_ = std::move(path);
    base_hash_ = std::move(hash);
  }
  // What the family's names in Hugging Face's format start with ("model.", "transformer.").
  const std::string& hf_prefix() const { return dims_.hf_prefix; }

 protected:
  explicit CausalLm(CausalLmDims dims);

  // The family's parts. embed: [n, T, d_model] for tokens [n, T] at `positions` int64 [T], or
  // [n, T] (packed documents).
  virtual at::Tensor embed(const at::Tensor& tokens, const at::Tensor& positions) = 0;
  virtual at::Tensor final_norm(const at::Tensor& x) = 0;
  // [padded_vocab_size, d_model]: the token embedding's weight when tied.
  virtual at::Tensor output_weight() const = 0;

  // An std::invalid_argument "FAMILY: what" unless `ok`.
  void require(bool ok, const std::string& what) const;

  // The blocks, in order (registered by the family as dims.blocks.{i}).
  std::vector<std::shared_ptr<Block>> blocks_;

 private:
  void require_tokens(const at::Tensor& tokens) const;
  void require_targets(const at::Tensor& tokens, const at::Tensor& targets) const;
  // The layout of packed documents at `positions` (checked against the tokens).
  Documents documents_of(const at::Tensor& tokens, const at::Tensor& positions) const;
  // final_norm's output: everything before the output layer, with the output unit entered.
  // `documents`: packed (null: one sequence per row).
  at::Tensor trunk(const at::Tensor& tokens, const Documents* documents = nullptr);
  // The loss of final_norm's output `h` (the output unit left).
  at::Tensor loss_of_trunk(const at::Tensor& h, const at::Tensor& targets);
  std::vector<std::pair<std::string, at::Tensor>> sums_of(const at::Tensor& loss,
                                                          const at::Tensor& targets) const;
  size_t output_unit() const { return dims_.tied ? 0 : 1 + blocks_.size(); }
  size_t unit_of(const std::string& name) const;  // the unit of a parameter or frozen buffer
  at::Tensor leave_output(const at::Tensor& x) const {
    return gate_ != nullptr ? gate_->leave(output_unit(), x) : x;
  }

  CausalLmDims dims_;           // checkpoint_activations and loss_chunk_rows as set since
  int64_t own_chunk_rows_ = 0;  // loss_chunk_rows as constructed (set_loss_chunk_rows(0))
  UnitGate* gate_ = nullptr;    // ddp.shard: parameters (set by the trainer)
  LoraOptions lora_;            // rank 0: no adapters
  std::vector<LoraSite> lora_sites_;
  std::vector<std::string> frozen_;  // the buffers add_lora made of the base's parameters
  std::string base_path_, base_hash_;
};

}  // namespace models
