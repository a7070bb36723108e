// Packed documents (models::PackedDocuments, models/documents.h) for gpt and llama: the logits of
// a packed window equal those of each document run alone (documents of 1, 37, context - 1 and
// exactly context tokens, within 1e-5 in fp32), also with activation checkpointing; the masked
// loss and every gradient against the PyTorch twins (tests/reference/gpt.py, llama.py) on the
// same packed batch with ignored targets (1e-4); the block-diagonal mask in closed form, and with
// a sliding window (models/attention_mask.h); a windowed model's documents alone as packed; and a
// model without the capability refused naming data.packing.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/shape.h"
#include "models/attention_mask.h"
#include "models/capabilities.h"
#include "models/documents.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/mlp.h"
#include "odd_llama.h"
#include "reference_harness.h"

namespace TRAINER_UNITY_ID {

using ::testing::HasSubstr;

constexpr int64_t kContext = 64;
constexpr int64_t kVocab = 61;  // pads to 64: the padded rows stay out of the loss

models::GptOptions gpt_options() {
  models::GptOptions o;
  o.vocab_size = kVocab;
  o.context = kContext;
  o.num_layers = 2;
  o.heads = 4;
  o.d_model = 32;
  return o;
}

// Grouped-query attention (6 heads over 2), head_dim 10 apart from d_model / heads, untied.
models::LlamaOptions llama_options() { return test::odd_llama_options(kContext, false); }

// A packed batch: rows of documents (their lengths, filling each row at most), the rest of a row
// padding (one more document, as data/token_shards.h pads: input 0, no target). Targets: the
// document's next token, -100 at its last position and where `masked` picks.
struct Packed {
  at::Tensor inputs, targets, positions;
  std::vector<std::vector<int64_t>> lengths;  // per row, the documents (padding not included)
};

Packed pack(const std::vector<std::vector<int64_t>>& rows, double masked = 0.0) {
  const auto n = static_cast<int64_t>(rows.size());
  Packed p{at::zeros({n, kContext}, at::kLong), at::full({n, kContext}, core::kIgnoreTarget),
           at::zeros({n, kContext}, at::kLong), rows};
  for (int64_t r = 0; r < n; ++r) {
    int64_t start = 0;
    std::vector<int64_t> lengths = rows[static_cast<size_t>(r)];
    int64_t used = 0;
    for (const int64_t l : lengths) used += l;
    if (used < kContext) lengths.push_back(kContext - used);  // the padding document
    for (size_t d = 0; d < lengths.size(); ++d) {
      const bool padding = d >= rows[static_cast<size_t>(r)].size();
      const int64_t l = lengths[d];
      const at::Tensor doc =
          padding ? at::zeros({l + 1}, at::kLong) : at::randint(0, kVocab, {l + 1}, at::kLong);
      p.inputs[r].narrow(0, start, l).copy_(doc.narrow(0, 0, l));
      p.positions[r].narrow(0, start, l).copy_(at::arange(l, at::kLong));
      if (!padding && l > 1) p.targets[r].narrow(0, start, l - 1).copy_(doc.narrow(0, 1, l - 1));
      start += l;
    }
  }
  if (masked > 0) {
    const at::Tensor drop = at::rand({n, kContext}).lt(masked);
    p.targets.masked_fill_(drop, core::kIgnoreTarget);
  }
  return p;
}

// Rows holding documents of 1, 37, context - 1 and context tokens (and others beside them).
std::vector<std::vector<int64_t>> every_length() {
  return {{1, 37, kContext - 38}, {kContext - 1, 1}, {kContext}, {37, 1}};
}

// Each document's logits in the packed window against the document run alone.
void expect_each_document_alone(models::CausalLm& model) {
  model.eval();
  at::NoGradGuard no_grad;
  const Packed p = pack(every_length());
  const at::Tensor packed = model.forward_packed(p.inputs, p.positions);
  for (size_t r = 0; r < p.lengths.size(); ++r) {
    int64_t start = 0;
    for (const int64_t l : p.lengths[r]) {
      const auto row = static_cast<int64_t>(r);
      const at::Tensor alone = model.forward(p.inputs[row].narrow(0, start, l).view({1, l}))[0];
      const at::Tensor there = packed[row].narrow(0, start, l);
      const double diff = (there - alone).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5 * std::max(1.0, alone.abs().max().item<double>()))
          << "row " << r << ", the document of " << l << " tokens at " << start;
      start += l;
    }
  }
}

TEST(PackedDocuments, GptLogitsOfEachDocumentEqualItsRunAlone) {
  at::manual_seed(1);
  models::Gpt model(gpt_options());
  expect_each_document_alone(model);
}

TEST(PackedDocuments, LlamaLogitsOfEachDocumentEqualItsRunAlone) {
  at::manual_seed(2);
  models::Llama model(llama_options());
  expect_each_document_alone(model);
}

// Llama's kin: a sliding window of 5 on the first of the two layers, and Qwen3's q and k norms.
// Within its document each token sees its 5 latest positions, as in the document run alone (where
// the window comes from the causal mask of models/attention_mask.h, not the documents').
TEST(PackedDocuments, WindowedLogitsOfEachDocumentEqualItsRunAlone) {
  at::manual_seed(3);
  models::LlamaOptions o = llama_options();
  o.sliding_window = 5;
  o.sliding_layers = {true, false};
  o.qk_norm = true;
  models::Llama model(o);
  expect_each_document_alone(model);
}

// The one rule's masks: a window of 3 after 2 cached keys, and within packed documents.
TEST(AttentionMask, CausalWithinAWindowAfterACacheAndWithinDocuments) {
  EXPECT_FALSE(models::needs_causal_mask(4, 0, 0));
  EXPECT_FALSE(models::needs_causal_mask(3, 0, 3));
  EXPECT_TRUE(models::needs_causal_mask(4, 0, 3));
  EXPECT_TRUE(models::needs_causal_mask(2, 2, 0));
  EXPECT_FALSE(models::needs_causal_mask(1, 2, 3));  // one query after 2 keys: all 3 in reach
  EXPECT_TRUE(models::needs_causal_mask(1, 3, 3));   // 4 keys, the first out of reach
  // Queries at positions 2, 3, 4 over keys 0 .. 4, each seeing its 3 latest.
  const at::Tensor cached = at::tensor({1, 1, 1, 0, 0,  //
                                        0, 1, 1, 1, 0,  //
                                        0, 0, 1, 1, 1},
                                       at::kInt)
                                .to(at::kBool)
                                .view({3, 5});
  EXPECT_TRUE(at::equal(models::causal_mask(3, 2, 3, at::TensorOptions()), cached));
  // Documents of 4 tokens and 2, a window of 2.
  const at::Tensor positions = at::tensor({0, 1, 2, 3, 0, 1}, at::kLong).view({1, 6});
  const at::Tensor documents = at::tensor({1, 0, 0, 0, 0, 0,  //
                                           1, 1, 0, 0, 0, 0,  //
                                           0, 1, 1, 0, 0, 0,  //
                                           0, 0, 1, 1, 0, 0,  //
                                           0, 0, 0, 0, 1, 0,  //
                                           0, 0, 0, 0, 1, 1},
                                          at::kInt)
                                   .to(at::kBool)
                                   .view({1, 1, 6, 6});
  EXPECT_TRUE(at::equal(models::document_mask(positions, 2), documents));
}

TEST(PackedDocuments, MaskIsBlockDiagonalCausal) {
  // Documents of 2 and 3 tokens, then padding of 1.
  const at::Tensor positions = at::tensor({0, 1, 0, 1, 2, 0}, at::kLong).view({1, 6});
  const at::Tensor expected = at::tensor({1, 0, 0, 0, 0, 0,  //
                                          1, 1, 0, 0, 0, 0,  //
                                          0, 0, 1, 0, 0, 0,  //
                                          0, 0, 1, 1, 0, 0,  //
                                          0, 0, 1, 1, 1, 0,  //
                                          0, 0, 0, 0, 0, 1},
                                         at::kInt)
                                  .to(at::kBool)
                                  .view({1, 1, 6, 6});
  EXPECT_TRUE(at::equal(models::Documents::mask_of(positions), expected));
}

std::map<std::string, std::string> gpt_meta(const models::GptOptions& o) {
  return {{"num_layers", std::to_string(o.num_layers)},
          {"heads", std::to_string(o.heads)},
          {"d_model", std::to_string(o.d_model)},
          {"vocab_size", std::to_string(o.vocab_size)}};
}

std::map<std::string, std::string> llama_meta(const models::LlamaOptions& o) {
  return {{"num_layers", std::to_string(o.num_layers)},
          {"heads", std::to_string(o.heads)},
          {"kv_heads", std::to_string(o.kv_heads)},
          {"head_dim", std::to_string(o.head_dim)},
          {"vocab_size", std::to_string(o.vocab_size)},
          {"rms_norm_eps", fmt::format("{}", o.rms_norm_eps)},
          {"rope_theta", fmt::format("{}", o.rope.theta)}};
}

TEST(PackedDocumentsReference, GptMaskedLossAndEveryGradientMatchPyTorch) {
  at::manual_seed(3);
  models::Gpt model(gpt_options());
  const Packed p = pack(every_length(), 0.3);
  test::expect_matches_reference(model, p.inputs, p.targets, "gpt.py", gpt_meta(gpt_options()),
                                 1e-4, {}, p.positions);
}

TEST(PackedDocumentsReference, LlamaMaskedLossAndEveryGradientMatchPyTorchWithCheckpointing) {
  at::manual_seed(4);
  models::LlamaOptions o = llama_options();
  o.checkpoint_activations = true;
  o.loss_chunk_rows = 37;
  models::Llama model(o);
  const Packed p = pack(every_length(), 0.3);
  test::expect_matches_reference(model, p.inputs, p.targets, "llama.py", llama_meta(o), 1e-4, {},
                                 p.positions);
}

TEST(PackedDocuments, CheckpointedGradientsEqualTheOnesKept) {
  at::manual_seed(5);
  models::Llama model(llama_options());
  const Packed p = pack(every_length(), 0.3);
  const auto grads = [&](bool checkpointed) {
    model.set_checkpoint_activations(checkpointed);
    model.zero_grad();
    model.loss_packed(p.inputs, p.targets, p.positions).backward();
    std::vector<at::Tensor> out;
    for (const auto& q : model.parameters()) out.push_back(q.grad().clone());
    return out;
  };
  const auto kept = grads(false), recomputed = grads(true);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(at::allclose(kept[i], recomputed[i]));
}

TEST(PackedDocuments, EvalSumsAreTheLossSummedOverTheCountedTargets) {
  at::manual_seed(6);
  models::Gpt model(gpt_options());
  model.eval();
  at::NoGradGuard no_grad;
  const Packed p = pack(every_length(), 0.3);
  const double counted = p.targets.ne(core::kIgnoreTarget).sum().item<double>();
  const auto sums = model.eval_sums_packed(p.inputs, p.targets, p.positions);
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums[0].first, "loss");
  const double mean = model.loss_packed(p.inputs, p.targets, p.positions).item<double>();
  EXPECT_NEAR(sums[0].second.item<double>(), mean * counted, 1e-9 * mean * counted);
}

TEST(PackedDocuments, ABatchWithoutTargetsHasLossZeroAndNoGradient) {
  at::manual_seed(7);
  models::Gpt model(gpt_options());
  Packed p = pack(every_length());
  p.targets.fill_(core::kIgnoreTarget);
  const at::Tensor loss = model.loss_packed(p.inputs, p.targets, p.positions);
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0);
  for (const auto& q : model.parameters()) {
    EXPECT_EQ(q.grad().abs().sum().item<double>(), 0.0);
  }
}

TEST(PackedDocuments, AModelWithoutTheCapabilityIsRefusedNamingDataPacking) {
  models::Mlp model(/*input_dim=*/4, /*hidden_dim=*/8, /*depth=*/1, /*num_classes=*/2);
  try {
    static_cast<void>(models::loss_of(model, at::zeros({2, 4}), at::zeros({2}, at::kLong),
                                      at::zeros({2, 4}, at::kLong)));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("data.packing"));
  }
}

}  // namespace TRAINER_UNITY_ID
