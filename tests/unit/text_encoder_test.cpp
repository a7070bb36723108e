// The frozen text encoder: against a reference written out step by step on the same weights,
// independence of rows and of padding, seeded initialisation, and loading weights from
// safetensors files (including every error, which names the file and the tensor).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"

namespace TRAINER_UNITY_ID {

using io::SafetensorsError;
using models::TextEncoder;
using models::TextEncoderOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kPad = TextEncoder::kPadId;

TextEncoderOptions small(uint64_t seed = 7) {
  return {.dim = 16, .layers = 2, .heads = 4, .max_len = 12, .out_dim = 8, .seed = seed};
}

// Rows of `texts` as bytes, padded with kPad to `len`.
at::Tensor tokens(const std::vector<std::string>& texts, int64_t len) {
  at::Tensor t = at::full({int64_t(texts.size()), len}, kPad, at::kLong);
  for (size_t i = 0; i < texts.size(); ++i) {
    for (size_t k = 0; k < texts[i].size() && int64_t(k) < len; ++k) {
      t[i][k] = static_cast<unsigned char>(texts[i][k]);
    }
  }
  return t;
}

// GPT-2 written out: explicit LayerNorm, per-head softmax attention with a causal mask, tanh
// GELU formula, mean over the text's positions. Uses none of the fused ops the encoder uses.
at::Tensor reference(const std::map<std::string, at::Tensor>& w, const TextEncoderOptions& o,
                     const std::string& text) {
  const auto W = [&](const std::string& name) { return w.at(name).to(at::kDouble); };
  const auto ln = [](const at::Tensor& x, const at::Tensor& g, const at::Tensor& b) {
    const at::Tensor mean = x.mean(-1, true);
    const at::Tensor var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / (var + 1e-5).sqrt() * g + b;
  };
  const auto gelu = [](const at::Tensor& x) {
    return 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
  };
  const int64_t m = int64_t(text.size());
  const int64_t hd = o.dim / o.heads;
  at::Tensor x = at::zeros({m, o.dim}, at::kDouble);
  for (int64_t p = 0; p < m; ++p) {
    x[p] = W("wte.weight")[static_cast<unsigned char>(text[p])] + W("wpe.weight")[p];
  }
  const at::Tensor future = at::ones({m, m}, at::kBool).triu(1);
  for (int64_t i = 0; i < o.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const at::Tensor h = ln(x, W(p + "ln_1.weight"), W(p + "ln_1.bias"));
    const at::Tensor qkv = h.matmul(W(p + "attn.c_attn.weight")) + W(p + "attn.c_attn.bias");
    std::vector<at::Tensor> outs;
    for (int64_t head = 0; head < o.heads; ++head) {
      const at::Tensor q = qkv.narrow(1, head * hd, hd);
      const at::Tensor k = qkv.narrow(1, o.dim + head * hd, hd);
      const at::Tensor v = qkv.narrow(1, 2 * o.dim + head * hd, hd);
      at::Tensor s = q.matmul(k.t()) / std::sqrt(double(hd));
      s = s.masked_fill(future, -INFINITY);
      const at::Tensor e = (s - std::get<0>(s.max(1, true))).exp();
      outs.push_back((e / e.sum(1, true)).matmul(v));
    }
    x = x + at::cat(outs, 1).matmul(W(p + "attn.c_proj.weight")) + W(p + "attn.c_proj.bias");
    const at::Tensor g = ln(x, W(p + "ln_2.weight"), W(p + "ln_2.bias"));
    x = x +
        gelu(g.matmul(W(p + "mlp.c_fc.weight")) + W(p + "mlp.c_fc.bias"))
            .matmul(W(p + "mlp.c_proj.weight")) +
        W(p + "mlp.c_proj.bias");
  }
  x = ln(x, W("ln_f.weight"), W("ln_f.bias"));
  return x.mean(0).matmul(W("proj.weight")) + W("proj.bias");
}

// Weights with non-trivial LayerNorm and bias values, so the reference checks them too.
std::map<std::string, at::Tensor> perturbed(const TextEncoder& e) {
  std::map<std::string, at::Tensor> w;
  at::manual_seed(3);
  for (const auto& [name, t] : e.weights()) w[name] = t + 0.1 * at::randn(t.sizes());
  return w;
}

class TextEncoderFiles : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  // The message of the SafetensorsError loading `p` into `e` throws; a failure if none.
  static std::string load_error(TextEncoder& e, const std::string& p) {
    try {
      e.load_safetensors(p);
    } catch (const SafetensorsError& err) {
      return err.what();
    }
    ADD_FAILURE() << "no SafetensorsError for " << p;
    return "";
  }

  test::TempDir dir_;
};

TEST(TextEncoder, MatchesAStepByStepReference) {
  TextEncoder e(small());
  const test::TempDir dir;
  io::write_safetensors(dir.file("ref.safetensors"), perturbed(e));
  e.load_safetensors(dir.file("ref.safetensors"));
  const std::vector<std::string> texts = {"Heat (1995)", "a", "Toy Story |"};
  const at::Tensor out = e.forward(tokens(texts, 12));
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 8}));
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE(texts[i]);
    const at::Tensor ref = reference(e.weights(), e.options(), texts[i]);
    EXPECT_TRUE(at::allclose(out[i].to(at::kDouble), ref, 1e-4, 1e-5)) << out[i] << "\n" << ref;
  }
}

TEST(TextEncoder, WeightsAreBuffersNotParameters) {
  TextEncoder e(small());
  EXPECT_TRUE(e.parameters().empty());
  const auto w = e.weights();
  EXPECT_EQ(w.size(), 2u + 12u * 2 + 4u);  // wte, wpe; 12 per block; ln_f and proj (2 each)
  for (const char* name : {"wte.weight", "wpe.weight", "h.1.attn.c_attn.weight",
                           "h.0.mlp.c_proj.bias", "ln_f.weight", "proj.weight"}) {
    ASSERT_TRUE(w.count(name)) << name;
    EXPECT_FALSE(w.at(name).requires_grad()) << name;
  }
  EXPECT_EQ(w.at("wte.weight").sizes(), (std::vector<int64_t>{257, 16}));
  EXPECT_EQ(w.at("h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(w.at("proj.weight").sizes(), (std::vector<int64_t>{16, 8}));
}

TEST(TextEncoder, SeededInitialisation) {
  TextEncoder a(small(7)), b(small(7)), c(small(8));
  const at::Tensor t = tokens({"Alien (1979) | Horror|Sci-Fi"}, 12);
  EXPECT_TRUE(at::equal(a.forward(t), b.forward(t)));
  EXPECT_FALSE(at::allclose(a.forward(t), c.forward(t)));
}

TEST(TextEncoder, RowsAndPaddingAreIndependent) {
  TextEncoder e(small());
  const std::vector<std::string> texts = {"Heat", "Casino (1995)", "", "x"};
  const at::Tensor batch = e.forward(tokens(texts, 12));
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE(texts[i]);
    // Alone, and with less padding: the same vector.
    EXPECT_TRUE(at::allclose(e.forward(tokens({texts[i]}, 12))[0], batch[i], 1e-5, 1e-6));
    const int64_t len = std::clamp<int64_t>(int64_t(texts[i].size()), 1, 12);
    EXPECT_TRUE(at::allclose(e.forward(tokens({texts[i]}, len))[0], batch[i], 1e-5, 1e-6));
  }
  // Different texts give different vectors; an all-padding row gives the projection's bias.
  EXPECT_FALSE(at::allclose(batch[0], batch[1]));
  EXPECT_TRUE(at::allclose(batch[2], e.weights().at("proj.bias")));
  EXPECT_EQ(e.forward(tokens({}, 12)).sizes(), (std::vector<int64_t>{0, 8}));
}

TEST(TextEncoder, RejectsBadSizes) {
  EXPECT_THROW(TextEncoder({.dim = 10, .heads = 4}), std::invalid_argument);
  EXPECT_THROW(TextEncoder({.dim = 16, .layers = 0}), std::invalid_argument);
  TextEncoder e(small());
  EXPECT_THROW(e.forward(tokens({"too long for twelve"}, 13)), std::invalid_argument);
  EXPECT_THROW(e.forward(at::zeros({2, 3}, at::kFloat)), std::invalid_argument);
}

TEST_F(TextEncoderFiles, LoadReplacesTheWeightsAndChangesTheOutput) {
  TextEncoder source(small(1)), target(small(2));
  const at::Tensor t = tokens({"Fargo (1996) | Crime|Drama", "Babe"}, 12);
  ASSERT_FALSE(at::allclose(source.forward(t), target.forward(t)));
  io::write_safetensors(path("enc.safetensors"), source.weights());
  target.load_safetensors(path("enc.safetensors"));
  EXPECT_TRUE(at::equal(source.forward(t), target.forward(t)));
}

TEST_F(TextEncoderFiles, LoadsHalfPrecisionFiles) {
  TextEncoder source(small(1)), target(small(2));
  std::map<std::string, at::Tensor> half;
  for (const auto& [name, w] : source.weights()) half[name] = w.to(at::kBFloat16);
  io::write_safetensors(path("bf16.safetensors"), half);
  target.load_safetensors(path("bf16.safetensors"));
  EXPECT_EQ(target.weights().at("wte.weight").scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(target.weights().at("wte.weight"), half.at("wte.weight").to(at::kFloat)));
}

TEST_F(TextEncoderFiles, LoadErrorsNameTheFileAndTensorAndChangeNothing) {
  TextEncoder source(small(1)), target(small(2));
  const at::Tensor t = tokens({"Ran (1985)"}, 12);
  const at::Tensor before = target.forward(t);

  auto w = source.weights();
  w.erase("h.1.ln_2.bias");
  const std::string missing = path("missing.safetensors");
  io::write_safetensors(missing, w);
  EXPECT_THAT(load_error(target, missing),
              AllOf(HasSubstr(missing), HasSubstr("missing tensor 'h.1.ln_2.bias'")));

  w = source.weights();
  w["wpe.weight"] = at::zeros({11, 16});
  const std::string shape = path("shape.safetensors");
  io::write_safetensors(shape, w);
  EXPECT_THAT(load_error(target, shape),
              AllOf(HasSubstr(shape), HasSubstr("'wpe.weight' has shape [11, 16]"),
                    HasSubstr("needs [12, 16]")));

  w = source.weights();
  w["h.2.ln_1.weight"] = at::ones({16});
  const std::string extra = path("extra.safetensors");
  io::write_safetensors(extra, w);
  EXPECT_THAT(load_error(target, extra), AllOf(HasSubstr(extra), HasSubstr("h.2.ln_1.weight")));

  w = source.weights();
  w["ln_f.bias"] = at::zeros({16}, at::kLong);
  const std::string dtype = path("dtype.safetensors");
  io::write_safetensors(dtype, w);
  EXPECT_THAT(load_error(target, dtype),
              AllOf(HasSubstr(dtype), HasSubstr("'ln_f.bias'"), HasSubstr("floating")));

  const std::string nofile = path("absent.safetensors");
  EXPECT_THAT(load_error(target, nofile), HasSubstr(nofile));

  EXPECT_TRUE(at::equal(target.forward(t), before));
}

}  // namespace TRAINER_UNITY_ID
