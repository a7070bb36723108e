// models/block.h: the parts a decoder other than gpt plugs in (RMSNorm, rotary positions, SwiGLU,
// grouped-query attention, no biases) against the plain formula written out here, the KV cache
// against the whole sequence, and a trainable projection drawing exactly as torch::nn::Linear.
// (gpt, the sequence transformer and the text encoder check the default parts against their
// PyTorch twins and step-by-step references.)
#include "models/block.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace TRAINER_UNITY_ID {

using models::Block;
using models::BlockOptions;

// A Llama-shaped block: RMSNorm, rotary, SwiGLU of its own width, 6 heads over 2 kv heads of
// head_dim 4 (so heads * head_dim = 24 differs from d_model = 20), no biases, Llama's names.
BlockOptions llama_like() {
  BlockOptions o;
  o.d_model = 20;
  o.heads = 6;
  o.kv_heads = 2;
  o.head_dim = 4;
  o.norm = models::NormKind::kRmsNorm;
  o.norm_eps = 1e-6;
  o.attn_bias = false;
  o.mlp = models::MlpKind::kSwiGlu;
  o.mlp_hidden = 28;
  o.mlp_bias = false;
  o.position = std::make_shared<models::Rotary>(models::rotary_inv_freq(o.head_dim, 500.0));
  o.names.norm_1 = "input_layernorm";
  o.names.attn = "self_attn";
  o.names.qkv = "qkv_proj";
  o.names.attn_out = "o_proj";
  o.names.norm_2 = "post_attention_layernorm";
  o.names.up = "up_proj";
  o.names.mlp_out = "down_proj";  // mlp, gate_proj, q_proj, k_proj, v_proj: the defaults
  return o;
}

// Every weight of `block` drawn N(0, 0.3) (norms around 1), so that no part is the identity.
void randomize(Block& block) {
  at::NoGradGuard no_grad;
  for (auto& p : block.parameters()) p.normal_(0.0, 0.3);
  block.norm_1().weight.add_(1.0);
  block.norm_2().weight.add_(1.0);
}

// The rotary embedding as a rotation of each pair (i, i + half) by position * inv_freq[i].
at::Tensor rotate(const at::Tensor& z, const at::Tensor& inv_freq, int64_t offset) {
  const int64_t half = z.size(-1) / 2, t = z.size(2);
  const at::Tensor angle = at::arange(offset, offset + t, at::kFloat).unsqueeze(1) * inv_freq;
  const at::Tensor a = z.narrow(-1, 0, half), b = z.narrow(-1, half, half);
  return at::cat({a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()}, -1);
}

// The block of llama_like(), written out with plain ops: causal softmax attention with the kv
// heads repeated per group.
at::Tensor reference(const Block& block, const at::Tensor& x) {
  const BlockOptions& o = block.options();
  const int64_t n = x.size(0), t = x.size(1), hd = o.head_dim;
  const auto rms = [&](const at::Tensor& v, const at::Tensor& w) {
    return v * at::rsqrt(v.pow(2).mean(-1, true) + o.norm_eps) * w;
  };
  const at::Tensor w = block.qkv().weight;  // rows: q, then k, then v
  const auto heads_of = [&](const at::Tensor& z, int64_t heads) {
    return z.view({n, t, heads, hd}).transpose(1, 2);
  };
  const at::Tensor h1 = rms(x, block.norm_1().weight);
  const at::Tensor inv_freq = models::rotary_inv_freq(hd, 500.0);
  at::Tensor q = heads_of(at::matmul(h1, w.narrow(0, 0, o.heads * hd).t()), o.heads);
  at::Tensor k =
      heads_of(at::matmul(h1, w.narrow(0, o.heads * hd, o.kv_heads * hd).t()), o.kv_heads);
  at::Tensor v = heads_of(
      at::matmul(h1, w.narrow(0, (o.heads + o.kv_heads) * hd, o.kv_heads * hd).t()), o.kv_heads);
  q = rotate(q, inv_freq, 0);
  k = rotate(k, inv_freq, 0).repeat_interleave(o.heads / o.kv_heads, 1);
  v = v.repeat_interleave(o.heads / o.kv_heads, 1);
  const at::Tensor future = at::ones({t, t}, at::kBool).triu(1);
  const at::Tensor scores =
      at::matmul(q, k.transpose(-1, -2)).div(std::sqrt(double(hd))).masked_fill(future, -INFINITY);
  const at::Tensor attn = at::matmul(scores.softmax(-1), v).transpose(1, 2).reshape({n, t, -1});
  const at::Tensor h = x + at::matmul(attn, block.attn_out().weight.t());
  const at::Tensor h2 = rms(h, block.norm_2().weight);
  const at::Tensor gate = at::matmul(h2, block.gate().weight.t());
  const at::Tensor up = at::matmul(h2, block.up().weight.t());
  return h + at::matmul(gate * at::sigmoid(gate) * up, block.mlp_out().weight.t());
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

TEST(Block, LlamaPartsMatchThePlainFormula) {
  at::manual_seed(1);
  Block block(llama_like());
  randomize(block);
  const at::Tensor x = at::randn({3, 7, 20});
  at::NoGradGuard no_grad;
  EXPECT_LT(relative_error(block.forward(x), reference(block, x)), 1e-5);
}

TEST(Block, KvCacheInPiecesEqualsTheWholeSequence) {
  at::manual_seed(2);
  Block block(llama_like());
  randomize(block);
  const at::Tensor x = at::randn({2, 6, 20});
  at::NoGradGuard no_grad;
  const at::Tensor whole = block.forward(x);
  at::Tensor keys, values;
  models::BlockCall call;
  call.past_keys = &keys;
  call.past_values = &values;
  std::vector<at::Tensor> parts;
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 3}, {3, 1}, {4, 2}}) {
    parts.push_back(block.forward(x.narrow(1, start, len), call));
  }
  EXPECT_EQ(keys.sizes(), (std::vector<int64_t>{2, 2, 6, 4}));  // kv heads only are cached
  EXPECT_LT(relative_error(at::cat(parts, 1), whole), 1e-5);
}

TEST(Block, GroupedQueryEqualsMultiHeadWithRepeatedKeysAndValues) {
  BlockOptions gqa = llama_like();
  gqa.position = nullptr;
  BlockOptions mha = gqa;
  mha.kv_heads = mha.heads;
  at::manual_seed(3);
  Block grouped(gqa), full(mha);
  randomize(grouped);
  {
    at::NoGradGuard no_grad;
    const int64_t hd = 4, group = 3;
    const at::Tensor w = grouped.qkv().weight;
    const auto heads = [&](int64_t first, int64_t count) {  // rows of `count` heads, repeated
      return w.narrow(0, first * hd, count * hd)
          .view({count, hd, 20})
          .repeat_interleave(group, 0)
          .reshape({-1, 20});
    };
    full.qkv().weight.copy_(at::cat({w.narrow(0, 0, 6 * hd), heads(6, 2), heads(8, 2)}, 0));
    full.attn_out().weight.copy_(grouped.attn_out().weight);
    full.gate().weight.copy_(grouped.gate().weight);
    full.up().weight.copy_(grouped.up().weight);
    full.mlp_out().weight.copy_(grouped.mlp_out().weight);
    full.norm_1().weight.copy_(grouped.norm_1().weight);
    full.norm_2().weight.copy_(grouped.norm_2().weight);
  }
  const at::Tensor x = at::randn({2, 5, 20});
  at::NoGradGuard no_grad;
  EXPECT_LT(relative_error(grouped.forward(x), full.forward(x)), 1e-6);
}

TEST(Block, SeparateQueryKeyValueProjectionsEqualTheFusedOne) {
  BlockOptions fused = llama_like();
  BlockOptions separate = fused;
  separate.fused_qkv = false;
  at::manual_seed(5);
  Block a(fused), b(separate);
  randomize(a);
  {
    at::NoGradGuard no_grad;
    const at::Tensor w = a.qkv().weight;
    b.q().weight.copy_(w.narrow(0, 0, 24));
    b.k().weight.copy_(w.narrow(0, 24, 8));
    b.v().weight.copy_(w.narrow(0, 32, 8));
    b.attn_out().weight.copy_(a.attn_out().weight);
    b.gate().weight.copy_(a.gate().weight);
    b.up().weight.copy_(a.up().weight);
    b.mlp_out().weight.copy_(a.mlp_out().weight);
    b.norm_1().weight.copy_(a.norm_1().weight);
    b.norm_2().weight.copy_(a.norm_2().weight);
  }
  std::vector<std::string> names;
  for (const auto& p : b.named_parameters()) names.push_back(p.key());
  EXPECT_THAT(names, testing::ElementsAre("input_layernorm.weight", "self_attn.q_proj.weight",
                                          "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                          "self_attn.o_proj.weight",
                                          "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                                          "mlp.up_proj.weight", "mlp.down_proj.weight"));
  const at::Tensor x = at::randn({2, 5, 20});
  at::NoGradGuard no_grad;
  EXPECT_LT(relative_error(b.forward(x), a.forward(x)), 1e-6);
}

TEST(Block, NamesFollowTheOptionsAndHaveNoBiasesWithoutThem) {
  Block block(llama_like());
  std::vector<std::string> names;
  for (const auto& p : block.named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "input_layernorm.weight", "self_attn.qkv_proj.weight",
                       "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                       "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}));
  EXPECT_EQ(block.qkv().weight.sizes(), (std::vector<int64_t>{(6 + 2 * 2) * 4, 20}));
  EXPECT_EQ(block.attn_out().weight.sizes(), (std::vector<int64_t>{20, 24}));
  EXPECT_EQ(block.up().weight.sizes(), (std::vector<int64_t>{28, 20}));
}

TEST(Block, TrainableProjectionDrawsAsTorchLinear) {
  at::manual_seed(4);
  torch::nn::Linear linear(6, 9);
  at::manual_seed(4);
  models::Projection projection(6, 9, /*bias=*/true, models::WeightLayout::kOutIn, false);
  EXPECT_TRUE(at::equal(projection.weight, linear->weight));
  EXPECT_TRUE(at::equal(projection.bias, linear->bias));
}

TEST(Block, FrozenWeightsAreBuffers) {
  BlockOptions o;
  o.d_model = 8;
  o.heads = 2;
  o.frozen = true;
  o.layout = models::WeightLayout::kInOut;
  Block block(o);
  EXPECT_TRUE(block.parameters().empty());
  EXPECT_EQ(block.qkv().weight.sizes(), (std::vector<int64_t>{8, 24}));  // [in, out]
}

TEST(Block, RejectsInconsistentSizes) {
  BlockOptions o = llama_like();
  o.kv_heads = 4;  // does not divide 6
  EXPECT_THROW(Block{o}, std::invalid_argument);
  o = llama_like();
  o.head_dim = 0;
  o.d_model = 20;  // 6 heads do not divide 20
  EXPECT_THROW(Block{o}, std::invalid_argument);
}

// LoRA's adapter weight gradients (LoraAddmm's backward): summed over the tokens in slices, each
// slice's partial sums in float32, they equal the plain GEMM's left^T right; off CUDA the tokens
// are one slice (the GEMM as autograd's).
TEST(Block, AdapterWeightGradientInSlicesEqualsTheWholeGemm) {
  at::manual_seed(3);
  const at::Tensor left = at::randn({4096, 24});
  const at::Tensor right = at::randn({4096, 40});
  const at::Tensor whole = at::mm(left.t(), right);
  EXPECT_EQ(models::adapter_gradient_chunks(left), 1);
  EXPECT_TRUE(at::equal(models::adapter_weight_gradient(left, right), whole));
  for (const int64_t chunks : {2, 4, 16}) {
    const at::Tensor sliced = models::adapter_weight_gradient(left, right, chunks);
    EXPECT_EQ(sliced.sizes(), whole.sizes());
    EXPECT_EQ(sliced.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(sliced, whole, 1e-4, 1e-3)) << chunks << " slices";
  }
  // bfloat16 operands: float32 out, within bfloat16's rounding of the float32 GEMM's.
  const at::Tensor low =
      models::adapter_weight_gradient(left.to(at::kBFloat16), right.to(at::kBFloat16), 4);
  EXPECT_EQ(low.scalar_type(), at::kFloat);
  EXPECT_LT((low - whole).abs().max().item<double>(), 0.02 * whole.abs().max().item<double>());
}

}  // namespace TRAINER_UNITY_ID
