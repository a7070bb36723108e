// Capabilities only some models have, each a small interface a model opts into by deriving from
// it besides Model (class Gpt final : public Model, public ChunkedLoss, ...). The loop finds them
// with as<Capability>(model), which is null for a model without it; Model itself keeps only what
// every model has (forward, loss, eval_sums, flops_per_token).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace models {

// The capability `C` of `model`, or null when the model does not have it.
template <class C>
C* as(Model& model) {
  return dynamic_cast<C*>(&model);
}
template <class C>
const C* as(const Model& model) {
  return dynamic_cast<const C*>(&model);
}

// Embedding caches (the OOM fallback's last rung, uncache_embeddings): build_cache() allocates
// them, on the model's device, before the first step; uncache() releases them for good (the
// model then computes what they held on the fly) and returns false when there was nothing left
// to release.
class EmbeddingCache {
 public:
  virtual ~EmbeddingCache() = default;
  virtual void build_cache() = 0;
  virtual bool uncache() = 0;
  // Whether there is a cache that uncache() would release.
  virtual bool has_cache() const = 0;
  // Names (as in named_buffers()) of the buffers that hold caches: derived state, left out of
  // checkpoints and rebuilt by build_cache().
  virtual std::vector<std::string> cache_buffer_names() const = 0;
};

// Ranking evaluation (train/evaluation.h, on data with a data::RankingTask): `users` int64 [u] on
// the model's device gives float [u, num_items] scores, without gradient.
class ItemScorer {
 public:
  virtual ~ItemScorer() = default;
  virtual at::Tensor score_all(const at::Tensor& users) = 0;
};

// Activation checkpointing (the memory.fallback rung checkpoint_activations): when on, the model
// keeps only each block's input in forward and recomputes the block in backward
// (models/activation_checkpoint.h).
class ActivationCheckpointing {
 public:
  virtual ~ActivationCheckpointing() = default;
  virtual void set_checkpoint_activations(bool on) = 0;
  virtual bool checkpoint_activations() const = 0;
};

// Channels-last (NHWC) memory format for models that convolve (train.channels_last): when on, the
// 4-D weights are stored channels-last and inputs are converted on entry, which cuDNN's
// tensor-core convolutions want. Call before gradients are attached (the Trainer does it before
// building the Reducer).
class ChannelsLast {
 public:
  virtual ~ChannelsLast() = default;
  virtual void set_channels_last(bool on) = 0;
};

// The memory plan's probe (memory/estimator.h): a loss computed over chunks of rows (the output
// layer over a large vocabulary, models/lm/linear_cross_entropy.h) holds its vocabulary-wide
// tensors for one chunk at a time, so that part stops growing once a micro-batch fills a chunk.
// loss_rows: the rows the loss takes for the batch `inputs`; loss_chunk_rows: the rows per chunk
// it uses for `rows` rows; set_loss_chunk_rows: caps the chunk at `rows` (0: the model's own),
// for the probe only.
class ChunkedLoss {
 public:
  virtual ~ChunkedLoss() = default;
  virtual int64_t loss_rows(const at::Tensor& inputs) const = 0;
  virtual int64_t loss_chunk_rows(int64_t rows) const = 0;
  virtual void set_loss_chunk_rows(int64_t rows) = 0;
};

// Parameter units (ddp.shard: parameters): the groups of parameters that are gathered whole for
// forward and backward and freed in between. Models know nothing of ranks: a model lists its units
// and tells a UnitGate, which the trainer gives it, where each unit's use begins and ends; the
// gate gathers and frees (train/unit_gate.h).
class UnitGate {
 public:
  virtual ~UnitGate() = default;
  // Before forward uses the parameters of `unit` (an index into parameter_units()).
  virtual void enter(size_t unit) = 0;
  // After forward's last use of `unit`: returns x, whose gradient in backward arrives before the
  // unit's own backward runs (an identity autograd function), so the gate can gather it again.
  virtual at::Tensor leave(size_t unit, const at::Tensor& x) = 0;
  // Before a collective of the caller's own that follows forwards only some ranks ran (each rank's
  // slice of an evaluation): returns once every rank has run all of its forwards, serving the
  // other ranks' gathers meanwhile (train::UnitGatherer, Note [Units in step]). Collective.
  virtual void settle() = 0;
};

// A model whose parameters fall into units: parameter_units() lists, in forward order, the names
// (as in named_parameters()) of each unit's parameters, every parameter in exactly one unit.
// With a gate set (non-null), forward calls gate->enter(u) before it uses unit u and
// x = gate->leave(u, x) after its last use of it, in the same order on every call (the order of
// the first training step is recorded; a later step that differs is refused). A unit may be
// entered more than once (gpt's tied embeddings: the embeddings and the output layer are one
// unit, entered at the start and at the end). Activation checkpointing recomputes inside the
// boundaries, so a recompute finds its unit gathered. A model without this capability is one
// unit, which the trainer gathers around the whole forward and backward.
class ParameterUnits {
 public:
  virtual ~ParameterUnits() = default;
  virtual std::vector<std::vector<std::string>> parameter_units() const = 0;
  // The names (as in named_buffers()) of each unit's frozen weights (FrozenBase: a LoRA run's
  // base), in the same units; empty when nothing is frozen. Under ddp.shard: parameters they
  // are sharded and gathered with their unit (ddp::ReducerOptions::frozen).
  virtual std::vector<std::vector<std::string>> frozen_units() const { return {}; }
  // The units in the order every forward enters them (a unit entered twice is listed twice).
  virtual std::vector<size_t> unit_order() const = 0;
  virtual void set_unit_gate(UnitGate* gate) = 0;
  virtual UnitGate* unit_gate() const = 0;  // the gate set, or null
};

struct LmShape;  // models/lm/lm_shape.h

// Planning from the shapes alone (--dry-run --plan-ranks; no weights, no probe): a language
// model's dimensions, from which the plan counts its parameters, units and activations.
class ShapePlanning {
 public:
  virtual ~ShapePlanning() = default;
  virtual LmShape lm_shape() const = 0;
};

// Packed documents (data.packing: documents; models/documents.h): each row of a batch holds
// several documents, and `positions` int64 [n, T] (data::Batch::positions: on the CPU or the
// model's device) gives each token's position within its document. The model uses them as
// position ids and attends only within each document (token i attends j iff j <= i and
// j >= i - positions[i]), so each document's logits are those it would get alone. The three
// calls are forward, loss and eval_sums with positions. A model without this capability cannot
// train on packed data (the trainer refuses it at start-up, naming data.packing).
class PackedDocuments {
 public:
  virtual ~PackedDocuments() = default;
  virtual at::Tensor forward_packed(const at::Tensor& inputs, const at::Tensor& positions) = 0;
  virtual at::Tensor loss_packed(const at::Tensor& inputs, const at::Tensor& targets,
                                 const at::Tensor& positions) = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> eval_sums_packed(
      const at::Tensor& inputs, const at::Tensor& targets, const at::Tensor& positions) = 0;
};

// Per-sequence log-probabilities (the preference objectives, train/objective.h): for tokens
// int64 [n, T] and targets of the same shape, float32 [n]: each row's summed log-probability of
// its targets (next-token log-softmax at each target's position; core::kIgnoreTarget skipped: a
// row without targets gives 0), differentiable when grad mode is on. The vocabulary's
// log-softmax is computed in float32, as autocast computes log_softmax.
class SequenceLogProbs {
 public:
  virtual ~SequenceLogProbs() = default;
  virtual at::Tensor sequence_logps(const at::Tensor& tokens, const at::Tensor& targets) = 0;
};

// A batch's loss and eval_sums: Model::loss and Model::eval_sums, or with `positions` defined
// (a packed batch) the PackedDocuments calls; std::invalid_argument naming data.packing for a
// model without them.
inline PackedDocuments& packed_documents(Model& model) {
  auto* packed = as<PackedDocuments>(model);
  if (packed == nullptr) {
    throw std::invalid_argument(
        "data.packing: documents: this model cannot attend within packed documents (gpt and "
        "llama can); set data.packing: none");
  }
  return *packed;
}
inline at::Tensor loss_of(Model& model, const at::Tensor& inputs, const at::Tensor& targets,
                          const at::Tensor& positions) {
  if (!positions.defined()) return model.loss(inputs, targets);
  return packed_documents(model).loss_packed(inputs, targets, positions);
}
inline std::vector<std::pair<std::string, at::Tensor>> eval_sums_of(Model& model,
                                                                    const at::Tensor& inputs,
                                                                    const at::Tensor& targets,
                                                                    const at::Tensor& positions) {
  if (!positions.defined()) return model.eval_sums(inputs, targets);
  return packed_documents(model).eval_sums_packed(inputs, targets, positions);
}

// One matrix Muon orthogonalises: rows [row_begin, row_begin + rows) of the 2-D parameter `param`
// (as named_parameters() names it), whole or a row range of a fused one (llama's q_proj, k_proj
// and v_proj of qkv_proj); `name`: what Hugging Face names it, without the family's prefix
// ("layers.0.self_attn.q_proj.weight").
struct HiddenMatrix {
  std::string name;
  std::string param;
  int64_t row_begin = 0;
  int64_t rows = 0;
};

// The hidden layers' 2-D weight matrices (train.optimizer: muon, train/muon.h), each as Hugging
// Face stores it as a matrix of its own, in named_parameters() order and by rows within a
// parameter; the matrices of a parameter cover all its rows. Muon updates these parameters;
// every other one (embeddings, the output layer, norms, biases) stays with AdamW. The list
// depends on the architecture only.
class HiddenMatrices {
 public:
  virtual ~HiddenMatrices() = default;
  virtual std::vector<HiddenMatrix> hidden_matrices() const = 0;
};

// The parameters that hold hidden matrices, each once, in order (Muon's momentum is kept and
// checkpointed per parameter: "muon.momentum.<name>").
inline std::vector<std::string> hidden_parameters(const HiddenMatrices& model) {
  std::vector<std::string> names;
  for (const HiddenMatrix& m : model.hidden_matrices()) {
    if (names.empty() || names.back() != m.param) names.push_back(m.param);
  }
  return names;
}

// A base that is frozen and not the run's own (LoRA, models/lm/lora.h): its weights are buffers
// loaded from the base's path (model.init_from) at every start, and checkpoints hold the
// adapters alone. frozen_buffer_names(): those buffers (as in named_buffers()), left out of
// checkpoints; empty when nothing is frozen. base_hash(): a hash of the base's config and its
// tensors' names, shapes and dtypes, which a checkpoint records and resume compares (a checkpoint
// of another base is refused); base_path(): where it was loaded from, for messages.
class FrozenBase {
 public:
  virtual ~FrozenBase() = default;
  virtual std::vector<std::string> frozen_buffer_names() const = 0;
  virtual std::string base_hash() const = 0;
  virtual std::string base_path() const = 0;
};

// Low-rank adapters over a frozen base (LoRA, models/lm/lora.h). has_adapters() is the one answer
// to "are adapters on?" for a built model (before the build: ModelOptions::has_adapters; of a
// checkpoint: checkpoint::CheckpointMeta::adapters_only). export_peft: --export-peft, PEFT's
// adapter_config.json and adapter_model.safetensors in `dir` over the base `base` names; returns
// the files. std::invalid_argument when the model has none.
class Adapters {
 public:
  virtual ~Adapters() = default;
  virtual bool has_adapters() const = 0;
  virtual std::vector<std::string> export_peft(const std::string& dir,
                                               const std::string& base) const = 0;
};

// Each unit's frozen buffers (ParameterUnits::frozen_units) by name and tensor, in its order;
// empty for a model without units or without a frozen base.
inline std::vector<std::vector<std::pair<std::string, at::Tensor>>> frozen_unit_buffers(
    const Model& model) {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> units;
  const auto* declared = as<ParameterUnits>(model);
  if (declared == nullptr) return units;
  const auto buffers = model.named_buffers();
  for (const auto& names : declared->frozen_units()) {
    auto& unit = units.emplace_back();
    for (const auto& name : names) unit.emplace_back(name, buffers[name]);
  }
  return units;
}

// The questions the loop asks of any model, false for a model without the capability.
inline bool has_cache(const Model& model) {
  const auto* c = as<EmbeddingCache>(model);
  return c != nullptr && c->has_cache();
}
inline bool checkpoints_activations(const Model& model) {
  const auto* c = as<ActivationCheckpointing>(model);
  return c != nullptr && c->checkpoint_activations();
}

}  // namespace models
