#include "models/block.h"

#include "models/capabilities.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>
#include <optional>
#include <stdexcept>

#include "models/activation_checkpoint.h"
#include "models/attention_mask.h"
#include "models/deferred_init.h"

namespace models {
namespace {

void require_block(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("block: " + message);
}

// The sizes left at 0 in `o`, resolved, and every size checked.
BlockOptions resolved(BlockOptions o) {
  require_block(o.d_model > 0 && o.heads > 0,
                fmt::format("d_model ({}) and heads ({}) must be positive", o.d_model, o.heads));
  if (o.head_dim == 0) {
    require_block(o.d_model % o.heads == 0,
                  fmt::format("heads ({}) must divide d_model ({})", o.heads, o.d_model));
    o.head_dim = o.d_model / o.heads;
  }
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  if (o.mlp_hidden == 0) o.mlp_hidden = 4 * o.d_model;
  require_block(
      o.head_dim > 0 && o.mlp_hidden > 0,
      fmt::format("head_dim ({}) and mlp_hidden ({}) must be positive", o.head_dim, o.mlp_hidden));
  require_block(o.kv_heads > 0 && o.heads % o.kv_heads == 0,
                fmt::format("kv_heads ({}) must divide heads ({})", o.kv_heads, o.heads));
  return o;
}

// y + scale (x A^T) B^T for a projection's adapters without dropout, as one autograd node with
// its backward written out: where autograd recorded a linear, an addmm and their casts, each
// with its own node and operators, per projection and micro-batch. A and B come in float32 (the
// adapters' dtype) and are cast to x's once; their gradients are GEMMs with float32 outputs
// (adapter_weight_gradient), with no cast of their own. On an H200 (bench/RESULTS.md) eager LoRA
// at the SmolLM-135M shape, which the host held back, went from 88.6 to 92.6 samples/s.
struct LoraAddmm final : torch::autograd::Function<LoraAddmm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y,
                            const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                            double scale) {
    const at::Tensor ac = a.to(x.scalar_type());
    const at::Tensor bc = b.to(x.scalar_type());
    const at::Tensor middle = at::mm(x, ac.t());
    ctx->save_for_backward({x, middle, ac, bc});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["a_dtype"] = a.scalar_type();
    ctx->saved_data["b_dtype"] = b.scalar_type();
    return at::addmm(y, middle, bc.t(), /*beta=*/1, /*alpha=*/scale);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &middle = saved[1], &ac = saved[2], &bc = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor dout = grads.at(0).reshape({-1, bc.size(0)});
    const at::Tensor dmiddle = at::mm(dout, bc).mul_(scale);
    at::Tensor dx, da, db;
    if (ctx->needs_input_grad(1)) dx = at::mm(dmiddle, ac);
    if (ctx->needs_input_grad(2)) {
      da = adapter_weight_gradient(dmiddle, x).to(ctx->saved_data["a_dtype"].toScalarType());
    }
    if (ctx->needs_input_grad(3)) {
      db = adapter_weight_gradient(dout, middle)
               .mul_(scale)
               .to(ctx->saved_data["b_dtype"].toScalarType());
    }
    return {grads.at(0), dx, da, db, at::Tensor()};
  }
};

// The causal rule for `queries` after `past` cached keys within `window`, as
// scaled_dot_product_attention takes it: (is_causal, mask). is_causal aligns its mask to the top
// left, which is wrong once keys outnumber queries, and knows no window: those take the mask of
// models/attention_mask.h, and one query after cached keys (within the window) attends them all.
std::pair<bool, std::optional<at::Tensor>> causal_rule(int64_t queries, int64_t past,
                                                       int64_t window,
                                                       const at::TensorOptions& options) {
  if (needs_causal_mask(queries, past, window)) {
    return {false, causal_mask(queries, past, window, options)};
  }
  return {past == 0, std::nullopt};
}

}  // namespace

Rotary::Rotary(at::Tensor inv_freq) : inv_freq_(inv_freq.to(at::kFloat).contiguous()) {
  require_block(inv_freq_.dim() == 1, "rotary: inv_freq must be one-dimensional");
}

std::pair<at::Tensor, at::Tensor> Rotary::apply(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& positions) const {
  const int64_t half = inv_freq_.size(0);
  require_block(q.size(-1) == 2 * half && k.size(-1) == 2 * half,
                fmt::format("rotary: head_dim {} needs {} frequencies, got {}", q.size(-1),
                            q.size(-1) / 2, half));
  at::Tensor f;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!on_device_.defined() || on_device_.device() != q.device()) {
      on_device_ = inv_freq_.to(q.device());
    }
    f = on_device_;
  }
  // [T, half] or [n, T, half]: position x frequency (at::outer's product, for each row).
  const at::Tensor angles = positions.to(f.options()).unsqueeze(-1) * f;
  at::Tensor both = at::cat({angles, angles}, -1);     // [.., T, head_dim]
  if (positions.dim() == 2) both = both.unsqueeze(1);  // [n, 1, T, head_dim]: every head
  const at::Tensor cos = both.cos().to(q.scalar_type()), sin = both.sin().to(q.scalar_type());
  const auto rotate = [&](const at::Tensor& z) {
    const at::Tensor rotated = at::cat({-z.narrow(-1, half, half), z.narrow(-1, 0, half)}, -1);
    return z * cos + rotated * sin;
  };
  return {rotate(q), rotate(k)};
}

at::Tensor rotary_inv_freq(int64_t head_dim, double theta) {
  require_block(head_dim > 0 && head_dim % 2 == 0,
                fmt::format("rotary: head_dim must be positive and even, got {}", head_dim));
  const at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / head_dim;
  return at::pow(theta, exponents).reciprocal();
}

Norm::Norm(int64_t dim, NormKind kind, double eps, bool frozen)
    : dim_(dim), kind_(kind), eps_(eps) {
  const auto add = [&](const char* name, double value) {
    if (frozen) return register_buffer(name, at::full({dim}, value));
    at::Tensor p = register_parameter(name, new_parameter({dim}));
    init_parameter(
        p, [value](const at::Tensor& t) { t.fill_(value); }, /*random=*/false);
    return p;
  };
  weight = add("weight", kind == NormKind::kRmsNormOffset ? 0.0 : 1.0);
  if (kind == NormKind::kLayerNorm) bias = add("bias", 0.0);
}

at::Tensor Norm::forward(const at::Tensor& x) const {
  if (kind_ == NormKind::kRmsNorm) return at::rms_norm(x, {dim_}, weight, eps_);
  if (kind_ == NormKind::kRmsNormOffset) {
    const at::Tensor f = x.to(at::kFloat);
    const at::Tensor normed = f * at::rsqrt(f.pow(2).mean(-1, true) + eps_);
    return (normed * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
  }
  return at::layer_norm(x, {dim_}, weight, bias, eps_);
}

int64_t adapter_gradient_chunks(const at::Tensor& left) {
  if (!left.is_cuda()) return 1;
  // Enough thread blocks for the GPU: up to 16 slices of at least 1024 tokens, a power of two
  // that divides the tokens (micro-batch times context).
  const int64_t tokens = left.size(0);
  int64_t chunks = 16;
  while (chunks > 1 && (tokens % chunks != 0 || tokens / chunks < 1024)) chunks /= 2;
  return chunks;
}

at::Tensor adapter_weight_gradient(const at::Tensor& left, const at::Tensor& right,
                                   int64_t chunks) {
  if (chunks == 0) chunks = adapter_gradient_chunks(left);
  const int64_t tokens = left.size(0), p = left.size(1), q = right.size(1);
  // float32 out of the GEMM on CUDA (its accumulator's precision); the CPU has no such GEMM.
  const bool cuda_low = left.is_cuda() && left.scalar_type() != at::kFloat;
  if (chunks == 1) {
    return cuda_low ? at::mm(left.t(), right, at::kFloat) : at::mm(left.t(), right).to(at::kFloat);
  }
  const at::Tensor l = left.reshape({chunks, tokens / chunks, p}).transpose(1, 2);
  const at::Tensor r = right.reshape({chunks, tokens / chunks, q});
  const at::Tensor partial = cuda_low ? at::bmm(l, r, at::kFloat) : at::bmm(l, r).to(at::kFloat);
  return partial.sum(0);
}

Projection::Projection(int64_t in, int64_t out, bool with_bias, WeightLayout layout, bool frozen)
    : layout_(layout) {
  const std::vector<int64_t> shape = layout == WeightLayout::kOutIn ? std::vector<int64_t>{out, in}
                                                                    : std::vector<int64_t>{in, out};
  if (frozen) {
    weight = register_buffer("weight", at::zeros(shape));
    if (with_bias) bias = register_buffer("bias", at::zeros({out}));
    return;
  }
  weight = register_parameter("weight", new_parameter(shape));
  if (with_bias) bias = register_parameter("bias", new_parameter({out}));
  // torch::nn::Linear's reset_parameters, draw for draw (the same random stream).
  init_parameter(weight, [layout](const at::Tensor& w) {
    torch::nn::init::kaiming_uniform_(layout == WeightLayout::kOutIn ? w : w.t(), std::sqrt(5.0));
  });
  if (with_bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    init_parameter(bias,
                   [bound](const at::Tensor& b) { torch::nn::init::uniform_(b, -bound, bound); });
  }
}

namespace {
thread_local int adapters_off = 0;  // AdaptersOff's live on this thread
}  // namespace

AdaptersOff::AdaptersOff() { ++adapters_off; }
AdaptersOff::~AdaptersOff() { --adapters_off; }
bool AdaptersOff::active() { return adapters_off > 0; }

at::Tensor Projection::forward(const at::Tensor& input) const {
  // Under autocast, x is cast once here for the base and every adapter (autocast casts each op's
  // inputs anew: once per adapter otherwise).
  const c10::DeviceType device = input.device().type();
  const bool autocast = !adapters_.empty() && at::autocast::is_autocast_enabled(device) &&
                        input.scalar_type() == at::kFloat;
  const at::Tensor x = autocast ? input.to(at::autocast::get_autocast_dtype(device)) : input;
  at::Tensor y;
  if (layout_ == WeightLayout::kOutIn) {
    y = at::linear(x, weight, bias);  // bias in the GEMM
  } else {
    y = at::matmul(x, weight);
    if (bias.defined()) y = y + bias;
  }
  if (adapters_.empty() || AdaptersOff::active()) return y;
  // Every adapter's narrow middle side by side, [n, sum of ranks], then one GEMM with the B
  // matrices laid out on their rows of the output ([out, sum of ranks], zero elsewhere: llama's
  // q_proj, k_proj, v_proj of the fused qkv_proj, block-diagonal when they tile its rows) that
  // adds into y: y + scale middle B^T. One full-size pass however many adapters, where an add or
  // a slice_scatter per adapter each read and wrote the whole output; without dropout the middles
  // are one GEMM too.
  const int64_t out = y.size(-1);
  const double scale = adapters_.front()->scale;  // alpha / rank, the model's for every adapter
  bool dropout = false;
  bool tiled = true;  // the adapters cover the rows in order, end to end (q, k and v of qkv)
  int64_t end = 0;
  std::vector<at::Tensor> as, bs;
  for (const auto& adapter : adapters_) {
    dropout = dropout || (adapter->dropout() > 0 && is_training());
    tiled = tiled && adapter->offset == end;
    end = adapter->offset + adapter->rows;
    as.push_back(adapter->a);
    bs.push_back(adapter->scale == scale ? adapter->b : adapter->b * (adapter->scale / scale));
  }
  tiled = tiled && end == out;
  for (size_t i = 0; i < bs.size() && !tiled; ++i) {
    const LoraAdapter& a = *adapters_[i];
    bs[i] = at::constant_pad_nd(bs[i], {0, 0, a.offset, out - a.offset - a.rows});
  }
  const at::Tensor b = bs.size() == 1 ? bs.front() : tiled ? at::block_diag(bs) : at::cat(bs, 1);
  if (!dropout) {
    const at::Tensor a = as.size() == 1 ? as.front() : at::cat(as, 0);
    return LoraAddmm::apply(y.reshape({-1, out}), x.reshape({-1, x.size(-1)}), a, b, scale)
        .view(y.sizes());
  }
  // Each adapter its own mask, as PEFT's separate lora_dropout modules (autograd's backward).
  std::vector<at::Tensor> middles;
  for (const auto& adapter : adapters_) middles.push_back(adapter->down(x, is_training()));
  const at::Tensor middle = at::cat(middles, -1);
  const at::Tensor y2 = at::addmm(y.reshape({-1, out}), middle.reshape({-1, middle.size(-1)}),
                                  b.t(), /*beta=*/1, /*alpha=*/scale);
  return y2.view(y.sizes());
}

void Projection::add_adapter(std::shared_ptr<LoraAdapter> adapter) {
  adapters_.push_back(std::move(adapter));
}

int64_t Projection::in_features() const {
  return weight.size(layout_ == WeightLayout::kOutIn ? 1 : 0);
}

int64_t Projection::out_features() const {
  return weight.size(layout_ == WeightLayout::kOutIn ? 0 : 1);
}

LoraAdapter::LoraAdapter(int64_t in, int64_t rows_, int64_t offset_, int64_t rank, double scale_,
                         double dropout)
    : lora_A(std::make_shared<torch::nn::Module>()), lora_B(std::make_shared<torch::nn::Module>()),
      offset(offset_), rows(rows_), scale(scale_), dropout_(dropout) {
  // Made and initialised as the base's parameters are (models/deferred_init.h): inside a
  // DeferredInit scope (the planner's model) without storage, their draws recorded.
  a = lora_A->register_parameter("weight", new_parameter({rank, in}));
  b = lora_B->register_parameter("weight", new_parameter({rows, rank}));
  // PEFT's reset_lora_parameters: nn.init.kaiming_uniform_(lora_A, a=math.sqrt(5)), B zero.
  init_parameter(a,
                 [](const at::Tensor& w) { torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0)); });
  init_parameter(
      b, [](const at::Tensor& w) { w.zero_(); }, /*random=*/false);
}

at::Tensor LoraAdapter::down(const at::Tensor& x, bool training) const {
  const double p = training ? dropout_ : 0.0;
  return at::linear(p > 0 ? at::dropout(x, p, true) : x, a);
}

Block::Block(const BlockOptions& options) : options_(resolved(options)) {
  const BlockOptions& o = options_;
  const BlockNames& names = o.names;
  const int64_t d = o.d_model, inner = o.heads * o.head_dim;
  const auto projection = [&](int64_t in, int64_t out, bool with_bias) {
    return std::make_shared<Projection>(in, out, with_bias, o.layout, o.frozen);
  };
  norm_1_ = register_module(names.norm_1, std::make_shared<Norm>(d, o.norm, o.norm_eps, o.frozen));
  auto attn = register_module(names.attn, std::make_shared<torch::nn::Module>());
  const int64_t kv_inner = o.kv_heads * o.head_dim;
  const bool qkv_bias = o.attn_bias || o.qkv_bias;
  if (o.fused_qkv) {
    qkv_ = attn->register_module(names.qkv, projection(d, inner + 2 * kv_inner, qkv_bias));
  } else {
    q_ = attn->register_module(names.q, projection(d, inner, qkv_bias));
    k_ = attn->register_module(names.k, projection(d, kv_inner, qkv_bias));
    v_ = attn->register_module(names.v, projection(d, kv_inner, qkv_bias));
  }
  attn_out_ = attn->register_module(names.attn_out, projection(inner, d, o.attn_bias));
  const auto norm = [&](int64_t dim) {
    return std::make_shared<Norm>(dim, o.norm, o.norm_eps, o.frozen);
  };
  if (o.qk_norm) {  // after o_proj, as Hugging Face's Qwen3 registers them
    q_norm_ = attn->register_module(names.q_norm, norm(o.head_dim));
    k_norm_ = attn->register_module(names.k_norm, norm(o.head_dim));
  }
  if (o.sandwich_norms) post_attn_ = register_module(names.post_attn, norm(d));
  norm_2_ = register_module(names.norm_2, norm(d));
  auto mlp = register_module(names.mlp, std::make_shared<torch::nn::Module>());
  if (o.mlp != MlpKind::kGelu) {
    gate_ = mlp->register_module(names.gate, projection(d, o.mlp_hidden, o.mlp_bias));
  }
  up_ = mlp->register_module(names.up, projection(d, o.mlp_hidden, o.mlp_bias));
  mlp_out_ = mlp->register_module(names.mlp_out, projection(o.mlp_hidden, d, o.mlp_bias));
  if (o.sandwich_norms) post_mlp_ = register_module(names.post_mlp, norm(d));
}

at::Tensor Block::forward(const at::Tensor& x, const BlockCall& call) const {
  const double p = call.dropout;
  at::Tensor a = attention(norm_1_->forward(x), call);
  if (post_attn_) a = post_attn_->forward(a);
  const at::Tensor h = x + at::dropout(a, p, p > 0);
  at::Tensor m = mlp(norm_2_->forward(h));
  if (post_mlp_) m = post_mlp_->forward(m);
  return h + at::dropout(m, p, p > 0);
}

at::Tensor Block::attention(const at::Tensor& x, const BlockCall& call) const {
  const BlockOptions& o = options_;
  const int64_t n = x.size(0), t = x.size(1), hd = o.head_dim;
  const auto split_heads = [&](const at::Tensor& z, int64_t heads) {
    return z.view({n, t, heads, hd}).transpose(1, 2);  // [n, heads, T, head_dim]
  };
  std::vector<at::Tensor> qkv;
  if (o.fused_qkv) {
    qkv = qkv_->forward(x).split_with_sizes({o.heads * hd, o.kv_heads * hd, o.kv_heads * hd}, -1);
  } else {
    qkv = {q_->forward(x), k_->forward(x), v_->forward(x)};
  }
  at::Tensor q = split_heads(qkv[0], o.heads);
  at::Tensor k = split_heads(qkv[1], o.kv_heads), v = split_heads(qkv[2], o.kv_heads);
  if (o.qk_norm) {
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  const bool cached = call.past_keys != nullptr;
  const int64_t past = cached && call.past_keys->defined() ? call.past_keys->size(2) : 0;
  if (o.position) {
    const at::Tensor positions = call.documents != nullptr
                                     ? call.documents->positions()
                                     : at::arange(past, past + t, x.options().dtype(at::kLong));
    std::tie(q, k) = o.position->apply(q, k, positions);
  }
  if (call.documents != nullptr) {
    require_block(!cached && call.mask == nullptr,
                  "packed documents with a mask or a KV cache are not supported");
    const at::Tensor a = call.documents->attend(q, k, v, call.dropout, o.window, o.attn_scale);
    return attn_out_->forward(a.transpose(1, 2).reshape({n, t, o.heads * hd}));
  }
  std::optional<at::Tensor> mask;
  bool causal = o.causal;
  if (call.mask != nullptr) {
    require_block(!cached && o.window == 0,
                  "a mask with a KV cache or a sliding window is not supported");
    mask = *call.mask;
    causal = false;
  }
  if (cached) {
    if (past > 0) {
      k = at::cat({*call.past_keys, k}, 2);
      v = at::cat({*call.past_values, v}, 2);
    }
    *call.past_keys = k;
    *call.past_values = v;
  }
  if (causal) std::tie(causal, mask) = causal_rule(t, past, o.window, x.options());
  const at::Tensor a = at::scaled_dot_product_attention(q, k, v, mask, call.dropout, causal,
                                                        o.attn_scale, o.kv_heads != o.heads);
  return attn_out_->forward(a.transpose(1, 2).reshape({n, t, o.heads * hd}));
}

at::Tensor Block::mlp(const at::Tensor& x) const {
  if (options_.mlp == MlpKind::kSwiGlu) {
    return mlp_out_->forward(at::silu(gate_->forward(x)) * up_->forward(x));
  }
  if (options_.mlp == MlpKind::kGeGlu) {
    return mlp_out_->forward(at::gelu(gate_->forward(x), "tanh") * up_->forward(x));
  }
  const at::Tensor u = up_->forward(x);
  const at::Tensor g = options_.fused_gelu
                           ? gelu(u, options_.gelu)
                           : at::gelu(u, options_.gelu == GeluApprox::kTanh ? "tanh" : "none");
  return mlp_out_->forward(g);
}

std::vector<std::shared_ptr<Block>> add_blocks(torch::nn::Module& owner, const std::string& name,
                                               int64_t count, const BlockOptions& options,
                                               const std::function<void(Block&)>& each) {
  return add_blocks(
      owner, name, count, [&options](int64_t) { return options; }, each);
}

std::vector<std::shared_ptr<Block>> add_blocks(
    torch::nn::Module& owner, const std::string& name, int64_t count,
    const std::function<BlockOptions(int64_t)>& options_of,
    const std::function<void(Block&)>& each) {
  auto list = owner.register_module(name, torch::nn::ModuleList());
  std::vector<std::shared_ptr<Block>> blocks;
  for (int64_t i = 0; i < count; ++i) {
    auto block = std::make_shared<Block>(options_of(i));
    if (each) each(*block);
    list->push_back(block);
    blocks.push_back(std::move(block));
  }
  return blocks;
}

at::Tensor run_blocks(const std::vector<std::shared_ptr<Block>>& blocks, at::Tensor x, double p,
                      bool checkpointed, const at::Tensor* mask, UnitGate* gate, size_t first_unit,
                      const Documents* documents) {
  BlockCall call;
  call.dropout = p;
  call.mask = mask;
  call.documents = documents;
  // Only when a graph is being recorded: evaluation (no grad) has no activations to keep.
  const bool recompute = checkpointed && at::GradMode::is_enabled();
  // The mask and the documents travel by value: backward recomputes the block after this frame
  // is gone.
  const at::Tensor kept = mask != nullptr ? *mask : at::Tensor();
  const std::optional<Documents> docs =
      documents != nullptr ? std::optional<Documents>(*documents) : std::nullopt;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& block = blocks[i];
    if (gate != nullptr) gate->enter(first_unit + i);
    if (!recompute) {
      x = block->forward(x, call);
    } else {
      x = checkpoint(
          [block, p, kept, docs](const at::Tensor& in) {
            BlockCall c;
            c.dropout = p;
            c.mask = kept.defined() ? &kept : nullptr;
            c.documents = docs ? &*docs : nullptr;
            return block->forward(in, c);
          },
          x);
    }
    if (gate != nullptr) x = gate->leave(first_unit + i, x);
  }
  return x;
}

at::Tensor run_blocks_cached(const std::vector<std::shared_ptr<Block>>& blocks, at::Tensor x,
                             KvCache& cache, UnitGate* gate, size_t first_unit) {
  if (cache.keys.empty()) {
    cache.keys.resize(blocks.size());
    cache.values.resize(blocks.size());
  }
  require_block(cache.keys.size() == blocks.size() && cache.values.size() == blocks.size(),
                "a KV cache of another model");
  BlockCall call;
  for (size_t i = 0; i < blocks.size(); ++i) {
    call.past_keys = &cache.keys[i];
    call.past_values = &cache.values[i];
    if (gate != nullptr) gate->enter(first_unit + i);
    x = blocks[i]->forward(x, call);
    if (gate != nullptr) x = gate->leave(first_unit + i, x);
  }
  return x;
}

}  // namespace models
