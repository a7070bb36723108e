// Block: the one pre-norm transformer block every transformer in models/ is built of (gpt, the
// sequence transformer, the recommender's text encoder; a Llama-style decoder plugs other parts
// into the same block).
//
//   x [n, T, d_model] -> h = x + dropout(attn(norm_1(x)));  y = h + dropout(mlp(norm_2(h)))
//     norm:  LayerNorm(eps, weight and bias) | RMSNorm(eps, weight only)
//     attn:  qkv = Projection(d_model, (heads + 2 kv_heads) head_dim) -> q, k, v split into heads
//              (or three projections q, k, v when fused_qkv is false: Hugging Face Llama's layout)
//            -> position scheme on q and k (none | rotary) -> scaled_dot_product_attention
//               (causal, or the caller's mask; grouped-query when kv_heads < heads; dropout p on
//               the probabilities; scale 1/sqrt(head_dim)); packed documents: block-diagonal
//               causal at each document's own positions (models/documents.h)
//            -> out = Projection(heads head_dim, d_model)
//     mlp:   GELU:   out(gelu(up(x)))             up: d_model -> mlp_hidden, out: back
//            SwiGLU: out(silu(gate(x)) * up(x))   gate, up: d_model -> mlp_hidden, out: back
//            GeGLU:  out(gelu_tanh(gate(x)) * up(x))
//   sandwich_norms (Gemma): h = x + dropout(post_attn(attn(norm_1(x)))), and post_mlp after the
//   MLP alike: each branch's output normed before it joins the residual.
//
// The parts are chosen by BlockOptions; a new decoder sets its fields (BlockOptions's comment
// says which model uses what). Parameter names are BlockNames (defaults: GPT-2's ln_1,
// attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj), registered in the order of the diagram
// (norm_1, attn.{qkv | q, k, v, out}, norm_2, mlp.{gate, up, out}), each projection's weight
// before its bias. A model that keeps another naming (a checkpoint's or Hugging Face's) passes
// its names.
//
// Initialisation: a trainable projection draws as torch::nn::Linear does (kaiming-uniform weight,
// uniform bias, from the default generator, in registration order); norms are weight 1, bias 0.
// Models that initialise otherwise overwrite the weights after construction (gpt: GPT-2's
// normal init). A frozen block (weights as buffers: no gradient, not in parameters(), saved and
// moved with the module) draws nothing: its projections are zero until the owner fills them.
//
// The forward's ops are exactly those each model had before the block was shared (the PyTorch
// twins and the baseline losses hold them to the last digit): at::linear for [out, in] weights,
// at::matmul + bias for GPT-2 Conv1D [in, out] weights, models::gelu or at::gelu as chosen.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/documents.h"
#include "models/layers.h"

namespace models {

// kRmsNormOffset: RMSNorm computed in float32 and scaled by (1 + weight), the weight starting at
// zero (Gemma's).
enum class NormKind { kLayerNorm, kRmsNorm, kRmsNormOffset };
// kGeGlu: SwiGLU's gated layout with tanh-approximated GELU for SiLU (Gemma's).
enum class MlpKind { kGelu, kSwiGlu, kGeGlu };
// [out, in] applied with at::linear (torch.nn.Linear), or [in, out] applied as x @ w + b (GPT-2's
// Conv1D, the text encoder's stored layout).
enum class WeightLayout { kOutIn, kInOut };

// How positions enter attention, applied to the queries and keys of each block (the model may
// also add a learned position embedding to its input, as gpt does, and pass no scheme).
class PositionScheme {
 public:
  virtual ~PositionScheme() = default;
  // q [n, heads, T, head_dim] and k [n, kv_heads, T, head_dim] at `positions`, int64 on their
  // device: [T] for every row alike (0 .. T-1, or past .. past + T - 1 after a KV cache's
  // positions), or [n, T] for each row its own (packed documents: models/documents.h). Returns
  // them position-coded.
  virtual std::pair<at::Tensor, at::Tensor> apply(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& positions) const = 0;
};

// Rotary position embedding (RoFormer; Llama's "rotate half" layout): dimension pairs (i,
// i + head_dim/2) of q and k at position p rotate by p * inv_freq[i]. inv_freq [head_dim / 2]
// float32: rotary_inv_freq(head_dim, theta) = theta^(-2i / head_dim); a scaled variant (Llama
// 3's rope scaling) passes its own. The angles are computed in float32 and cast to q's dtype.
class Rotary final : public PositionScheme {
 public:
  explicit Rotary(at::Tensor inv_freq);
  std::pair<at::Tensor, at::Tensor> apply(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& positions) const override;

 private:
  at::Tensor inv_freq_;  // CPU
  // inv_freq_ on the device of the last apply(): copied once, not in every forward (a copy from
  // pageable host memory waits for the device, and a CUDA graph cannot capture it).
  mutable std::mutex mutex_;
  mutable at::Tensor on_device_;
};
at::Tensor rotary_inv_freq(int64_t head_dim, double theta);

// A norm over the last dimension: LayerNorm (weight, bias) or RMSNorm (weight; kRmsNormOffset:
// x / rms(x) * (1 + weight) in float32, cast back to x's dtype, as Gemma3RMSNorm).
class Norm final : public torch::nn::Module {
 public:
  Norm(int64_t dim, NormKind kind, double eps, bool frozen);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;  // bias undefined for RMSNorm

 private:
  int64_t dim_;
  NormKind kind_;
  double eps_;
};

// A low-rank adapter (LoRA; models/lm/lora.h) on rows [offset, offset + rows) of a projection's
// output: adds scale * dropout(x) A^T B^T there, as PEFT's LoRA layer. A [rank, in] draws
// Kaiming-uniform (a = sqrt(5), PEFT's default), B [rows, rank] is zero, so that a new adapter
// changes nothing. Its two modules (lora_A with A as "weight", lora_B with B: PEFT's names) are
// registered by the owner on the module that bears the adapted layer's Hugging Face name.
class LoraAdapter {
 public:
  LoraAdapter(int64_t in, int64_t rows, int64_t offset, int64_t rank, double scale, double dropout);
  // dropout(x) A^T: [..., rank], the adapter's narrow middle; the dropout in training only.
  at::Tensor down(const at::Tensor& x, bool training) const;
  double dropout() const { return dropout_; }
  std::shared_ptr<torch::nn::Module> lora_A, lora_B;  // NOLINT(readability-identifier-naming)
  at::Tensor a, b;  // lora_A.weight [rank, in], lora_B.weight [rows, rank]
  int64_t offset, rows;
  double scale;

 private:
  double dropout_;
};

// While one lives on a thread, every Projection's forward on that thread leaves its adapters out:
// the frozen base alone (PEFT's disable_adapter()), the reference model of a preference objective
// under LoRA (train/objective.h). Nests.
class AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
  static bool active();
};

// An adapter's weight gradient, left^T right ([tokens, p], [tokens, q] -> [p, q], float32):
// summed over the tokens in `chunks` slices by one batched GEMM (0: adapter_gradient_chunks),
// each slice's partial sums in float32 (CUDA's GEMMs write float32 from bfloat16 operands; the
// CPU's round to the operands' dtype first). The slices keep thread blocks busy on an output of
// a few thousand elements over tens of thousands of tokens.
at::Tensor adapter_weight_gradient(const at::Tensor& left, const at::Tensor& right,
                                   int64_t chunks = 0);
// The slices for `left`'s tokens: 1 off CUDA; on CUDA up to 16 of at least 1024 tokens each.
int64_t adapter_gradient_chunks(const at::Tensor& left);

// y = x W^T + b (kOutIn) or x W + b (kInOut); b optional; plus each adapter's delta on its rows,
// all of a projection's adapters in one GEMM that adds into y (Projection::forward).
class Projection final : public torch::nn::Module {
 public:
  Projection(int64_t in, int64_t out, bool bias, WeightLayout layout, bool frozen);
  at::Tensor forward(const at::Tensor& x) const;
  // Adds `adapter` (registered by the caller) to the output from now on.
  void add_adapter(std::shared_ptr<LoraAdapter> adapter);
  int64_t in_features() const;
  int64_t out_features() const;
  WeightLayout layout() const { return layout_; }
  at::Tensor weight, bias;  // bias undefined without one

 private:
  WeightLayout layout_;
  std::vector<std::shared_ptr<LoraAdapter>> adapters_;
};

// Submodule and parameter names under the block. `gate` is registered for the gated MLPs only;
// `qkv` with fused_qkv, `q`, `k`, `v` without; post_attn and post_mlp with sandwich_norms only.
struct BlockNames {
  std::string norm_1 = "ln_1", attn = "attn", qkv = "c_attn", attn_out = "c_proj";
  std::string q = "q_proj", k = "k_proj", v = "v_proj", q_norm = "q_norm", k_norm = "k_norm";
  std::string post_attn = "post_attn_norm";
  std::string norm_2 = "ln_2", mlp = "mlp", gate = "gate_proj", up = "c_fc", mlp_out = "c_proj";
  std::string post_mlp = "post_mlp_norm";
};

// The block's shape and parts. Defaults are GPT-2's block; each model sets what differs:
//   gpt:           the defaults (causal, fused tanh GELU, [out, in] trainable weights)
//   sequence:      causal false, gelu kNone (exact, erf)
//   text encoder:  frozen, layout kInOut, fused_gelu false, causal false with a padding mask
//   llama:         norm kRmsNorm + its eps, no biases, MlpKind::kSwiGlu with its mlp_hidden,
//                  kv_heads and head_dim from its config, position = a Rotary (one, shared by
//                  every block) and Hugging Face's BlockNames; its kin set qkv_bias (Qwen2),
//                  qk_norm (Qwen3) or a window (Mistral); Gemma 3 kRmsNormOffset,
//                  sandwich_norms, kGeGlu, qk_norm, attn_scale and a rotary per kind of layer
struct BlockOptions {
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: heads; fewer (dividing heads): grouped-query attention
  int64_t head_dim = 0;  // 0: d_model / heads (heads must then divide d_model)
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  bool attn_bias = true;  // qkv (or q, k, v) and out
  bool qkv_bias = false;  // qkv (or q, k, v) even without attn_bias (Qwen2: not on out)
  // RMSNorm (norm_eps) over each head of q and k, after the projection and before the position
  // scheme, weights [head_dim] named q_norm and k_norm under the attention (Qwen3).
  bool qk_norm = false;
  // Sliding-window attention: a query attends the `window` latest positions, its own included
  // (transformers' sliding_window: key j within reach of query i iff i - j < window); 0: every
  // earlier position. Combined with the causal rule, packed documents and a KV cache alike
  // (models/attention_mask.h).
  int64_t window = 0;
  // The attention's scale on q k^T (Gemma 3: query_pre_attn_scalar^-0.5); none: 1/sqrt(head_dim).
  std::optional<double> attn_scale;
  // A norm after the attention (post_attn) and after the MLP (post_mlp), on each branch's output
  // before the residual (Gemma 2 and 3).
  bool sandwich_norms = false;
  bool fused_qkv = true;  // one projection for q, k and v; false: three
  MlpKind mlp = MlpKind::kGelu;
  int64_t mlp_hidden = 0;  // 0: 4 d_model
  bool mlp_bias = true;    // gate, up and out
  GeluApprox gelu = GeluApprox::kTanh;
  bool fused_gelu = true;  // models::gelu (one fused pass on CPU float32); false: at::gelu
  bool causal = true;      // each position sees itself and earlier ones (unless a mask is given)
  std::shared_ptr<const PositionScheme> position;  // null: none inside attention
  WeightLayout layout = WeightLayout::kOutIn;
  bool frozen = false;
  BlockNames names;
};

// One forward's inputs besides x.
struct BlockCall {
  double dropout = 0.0;  // p on the attention probabilities and each branch's output (0: none)
  // Bool, broadcastable to [n, heads, T, keys]: true where a query may attend a key. Replaces
  // the causal rule when given.
  const at::Tensor* mask = nullptr;
  // Packed documents (models/documents.h): each row holds several documents; the position
  // scheme takes their positions and attention stays within each document (block-diagonal
  // causal). Not with a mask or a KV cache.
  const Documents* documents = nullptr;
  // Incremental decoding: the keys and values of earlier positions, [n, kv_heads, past,
  // head_dim] (undefined: none yet). x holds the positions after them; its queries attend those
  // too, and both are extended by x's own.
  at::Tensor* past_keys = nullptr;
  at::Tensor* past_values = nullptr;
};

class Block final : public torch::nn::Module {
 public:
  // Throws std::invalid_argument ("block: ...") for inconsistent sizes; models check their keys
  // first and name them.
  explicit Block(const BlockOptions& options);
  at::Tensor forward(const at::Tensor& x, const BlockCall& call = {}) const;

  // The parts, for models that initialise or load them (gate(): SwiGLU only).
  Norm& norm_1() const { return *norm_1_; }
  Norm& norm_2() const { return *norm_2_; }
  Norm& post_attn() const { return *post_attn_; }  // sandwich_norms only
  Norm& post_mlp() const { return *post_mlp_; }
  Norm& q_norm() const { return *q_norm_; }  // qk_norm only
  Norm& k_norm() const { return *k_norm_; }
  Projection& qkv() const { return *qkv_; }  // fused_qkv only
  Projection& q() const { return *q_; }      // the three: without fused_qkv only
  Projection& k() const { return *k_; }
  Projection& v() const { return *v_; }
  Projection& attn_out() const { return *attn_out_; }
  Projection& gate() const { return *gate_; }  // gated MLPs only
  Projection& up() const { return *up_; }
  Projection& mlp_out() const { return *mlp_out_; }
  const BlockOptions& options() const { return options_; }

 private:
  at::Tensor attention(const at::Tensor& x, const BlockCall& call) const;
  at::Tensor mlp(const at::Tensor& x) const;

  BlockOptions options_;  // kv_heads, head_dim and mlp_hidden resolved
  std::shared_ptr<Norm> norm_1_, norm_2_, q_norm_, k_norm_, post_attn_, post_mlp_;
  std::shared_ptr<Projection> qkv_, q_, k_, v_, attn_out_, gate_, up_, mlp_out_;
};

// Keys and values of the positions decoded so far, one pair per block, each
// [n, kv_heads, positions, head_dim] (a decoder's forward_cached fills it). Empty: no positions.
struct KvCache {
  std::vector<at::Tensor> keys, values;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
};

// A stack of blocks, registered on `owner` as a ModuleList named `name` (so the parameters are
// name.{i}.*), built in order; `each` runs on each block right after it is built (gpt draws its
// init there, so the random stream is consumed block by block).
std::vector<std::shared_ptr<Block>> add_blocks(torch::nn::Module& owner, const std::string& name,
                                               int64_t count, const BlockOptions& options,
                                               const std::function<void(Block&)>& each = {});
// The same with block i's options options_of(i) (a window on some layers only).
std::vector<std::shared_ptr<Block>> add_blocks(
    torch::nn::Module& owner, const std::string& name, int64_t count,
    const std::function<BlockOptions(int64_t)>& options_of,
    const std::function<void(Block&)>& each = {});

class UnitGate;  // models/capabilities.h

// x through `blocks` in order with dropout p. checkpointed: each block keeps only its input and
// is recomputed in backward (models/activation_checkpoint.h), when a graph is being recorded.
// gate (ddp.shard: parameters): block i is unit first_unit + i, entered before it and left after
// it, outside the checkpoint, so that its recompute runs with the unit gathered. documents:
// packed documents (BlockCall::documents).
at::Tensor run_blocks(const std::vector<std::shared_ptr<Block>>& blocks, at::Tensor x, double p,
                      bool checkpointed, const at::Tensor* mask = nullptr, UnitGate* gate = nullptr,
                      size_t first_unit = 0, const Documents* documents = nullptr);
// Incremental decoding through `blocks` (no dropout), extending `cache` (sized on first use);
// with a `gate`, block i is unit first_unit + i, entered and left around it.
at::Tensor run_blocks_cached(const std::vector<std::shared_ptr<Block>>& blocks, at::Tensor x,
                             KvCache& cache, UnitGate* gate = nullptr, size_t first_unit = 0);

}  // namespace models
