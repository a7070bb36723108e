// linear_cross_entropy (the chunked output layer and loss): the same loss and gradients as
// linear + cross_entropy with the padded rows cut off, in fp32 and under bf16 autocast, for every
// chunking; ignored targets (core::kIgnoreTarget) skipped as cross_entropy's ignore_index skips
// them, and none at all giving 0; no gradient work without grad mode, nor for a frozen weight or
// h; a peak memory that the chunk bounds; input errors.
#include "models/lm/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <stdexcept>

#include "core/shape.h"
#include "memory/allocator_guard.h"
#include "memory/memory_stats.h"
#include "reference_harness.h"
#include "train/precision.h"

namespace TRAINER_UNITY_ID {

using models::linear_cross_entropy;

struct Result {
  at::Tensor loss, grad_h, grad_w;
};

struct Problem {
  at::Tensor h, w, targets;
  int64_t vocab;
};

// rows x d hidden states, a weight of `padded` rows of which `vocab` are real.
Problem problem(int64_t rows, int64_t d, int64_t vocab, int64_t padded, uint64_t seed) {
  at::manual_seed(seed);
  return {at::randn({rows, d}), at::randn({padded, d}) * 0.5, at::randint(vocab, {rows}, at::kLong),
          vocab};
}

// `weight` times the loss, then backward; `chunk_rows` < 0 is the unfused reference: the full
// logits, the padded columns cut off, at::cross_entropy_loss.
Result run(const Problem& p, int64_t chunk_rows, double weight = 1.0, bool bf16 = false) {
  const at::Tensor h = p.h.clone().requires_grad_(true), w = p.w.clone().requires_grad_(true);
  at::Tensor loss;
  {
    train::AutocastScope autocast(c10::Device(c10::kCPU),
                                  bf16 ? train::Precision::kBf16 : train::Precision::kFp32);
    if (chunk_rows < 0) {
      loss = at::cross_entropy_loss(at::linear(h, w).narrow(1, 0, p.vocab), p.targets);
    } else {
      loss = linear_cross_entropy(h, w, p.targets, p.vocab, chunk_rows);
    }
  }
  (loss * weight).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

void expect_close(const Result& a, const Result& b, double tolerance) {
  EXPECT_LT(test::relative_error(a.loss, b.loss), tolerance)
      << a.loss.item<double>() << " vs " << b.loss.item<double>();
  EXPECT_LT(test::relative_error(a.grad_h, b.grad_h), tolerance) << "gradient of h";
  EXPECT_LT(test::relative_error(a.grad_w, b.grad_w), tolerance) << "gradient of the weight";
}

TEST(LinearCrossEntropy, ChunkRowsSpreadRowsEvenly) {
  EXPECT_EQ(models::linear_cross_entropy_chunk_rows(37, 64, 5), 5);     // 8 chunks: 7 x 5 + 2
  EXPECT_EQ(models::linear_cross_entropy_chunk_rows(36, 64, 7), 6);     // 6 chunks of 6
  EXPECT_EQ(models::linear_cross_entropy_chunk_rows(10, 64, 100), 10);  // one chunk
  // Default: 256 MiB of fp32 logits. GPT-2's 16 x 1024 positions over 50,304 columns: 13 chunks.
  EXPECT_EQ(models::linear_cross_entropy_chunk_rows(16384, 50304), 1261);
  EXPECT_LE(models::linear_cross_entropy_chunk_rows(16384, 50304) * 50304 * 4, int64_t{256} << 20);
}

TEST(LinearCrossEntropy, MatchesLinearThenCrossEntropyForEveryChunking) {
  const Problem p = problem(37, 16, 61, 64, 1);  // 61 real columns padded to 64
  const Result reference = run(p, -1, 3.5);
  for (const int64_t chunk : {1, 5, 36, 37, 100, 0}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    const Result fused = run(p, chunk, 3.5);
    expect_close(fused, reference, 1e-5);
    // The padded rows are never predicted: exactly zero gradient.
    EXPECT_EQ(fused.grad_w.narrow(0, 61, 3).abs().max().item<float>(), 0.0f);
  }
}

// Targets core::kIgnoreTarget take no part: the loss is the mean over the others (cross_entropy's
// ignore_index), both gradients as its, for every chunking and under bf16 autocast too.
TEST(LinearCrossEntropy, IgnoredTargetsAreSkippedLikeCrossEntropysIgnoreIndex) {
  Problem p = problem(37, 16, 61, 64, 3);
  p.targets.masked_fill_(at::rand({37}).lt(0.4), core::kIgnoreTarget);
  p.targets[0] = core::kIgnoreTarget;
  p.targets[36] = core::kIgnoreTarget;
  const Result reference = run(p, -1, 2.5);  // at::cross_entropy_loss ignores -100 by default
  for (const int64_t chunk : {1, 5, 36, 0}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    const Result fused = run(p, chunk, 2.5);
    expect_close(fused, reference, 1e-5);
    // An ignored row's hidden state gets exactly no gradient.
    EXPECT_EQ(fused.grad_h[0].abs().max().item<float>(), 0.0f);
    EXPECT_EQ(fused.grad_h[36].abs().max().item<float>(), 0.0f);
  }
  const Result exact = run(p, -1, 1.0), bf16 = run(p, 7, 1.0, /*bf16=*/true);
  expect_close(bf16, exact, 2e-2);
}

TEST(LinearCrossEntropy, NoTargetsGiveLossZeroAndZeroGradientsNotNaN) {
  Problem p = problem(9, 8, 61, 64, 4);
  p.targets.fill_(core::kIgnoreTarget);
  const Result r = run(p, 4);
  EXPECT_EQ(r.loss.item<float>(), 0.0f);
  EXPECT_EQ(r.grad_h.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(r.grad_w.abs().max().item<float>(), 0.0f);
}

// Two bf16 computations differ by bf16's rounding (2^-9 relative) whatever their order, so the
// check is against the fp32 result: the chunked bf16 path is about as close to it as the unfused
// one (within 2x: they round different values, softmax - one-hot here and that over the row count
// there). Once on random logits, once on confident ones (each target's probability 0.87 to 0.9996,
// where the gradient is the small 1 - p_t, which rounding p_t before subtracting would lose: that
// mistake is 15x the unfused error).
TEST(LinearCrossEntropy, FollowsAutocastAsAccuratelyAsLinearThenCrossEntropy) {
  // Logits exact in bf16 (the weight the identity, each h its target's unit vector times a bf16
  // number in [6, 10]), so only the rounding of the gradient remains.
  Problem confident = problem(400, 64, 61, 64, 2);
  confident.w = at::eye(64);
  confident.h = at::one_hot(confident.targets, 64).to(at::kFloat) *
                (at::rand({400, 1}) * 4 + 6).to(at::kBFloat16).to(at::kFloat);
  const Problem random = problem(40, 32, 100, 128, 2);
  for (const Problem& p : {random, confident}) {
    const Result exact = run(p, -1, 1.0, /*bf16=*/false);
    const Result unfused = run(p, -1, 1.0, /*bf16=*/true);
    const Result fused = run(p, 7, 1.0, /*bf16=*/true);
    const auto errors = [&](const Result& r) {
      return std::array<double, 3>{test::relative_error(r.loss, exact.loss),
                                   test::relative_error(r.grad_h, exact.grad_h),
                                   test::relative_error(r.grad_w, exact.grad_w)};
    };
    const auto e_unfused = errors(unfused), e_fused = errors(fused);
    const char* what[] = {"loss", "gradient of h", "gradient of the weight"};
    std::printf("loss %.4f (fp32)\n", exact.loss.item<double>());
    for (int i = 0; i < 3; ++i) {
      std::printf("  %s: relative error against fp32 %.2e unfused, %.2e chunked\n", what[i],
                  e_unfused[i], e_fused[i]);
      // On random logits bf16 shows in every result (the check can tell the precisions apart).
      EXPECT_LT(e_fused[i], 2 * e_unfused[i] + 1e-6) << what[i];
      if (&p == &random) {
        EXPECT_GT(e_fused[i], 1e-5) << what[i];
      }
    }
    EXPECT_EQ(fused.loss.scalar_type(), at::kFloat);
    EXPECT_EQ(fused.grad_h.scalar_type(), at::kFloat);
  }
}

TEST(LinearCrossEntropy, WithoutGradModeGivesTheSameLossAndKeepsNoGraph) {
  const Problem p = problem(23, 8, 50, 64, 3);
  const at::Tensor w = p.w.clone().requires_grad_(true);
  const at::Tensor with_grad = linear_cross_entropy(p.h, w, p.targets, p.vocab, 4);
  at::Tensor without;
  {
    at::NoGradGuard no_grad;
    without = linear_cross_entropy(p.h, w, p.targets, p.vocab, 4);
  }
  EXPECT_TRUE(with_grad.requires_grad());
  EXPECT_FALSE(without.requires_grad());
  EXPECT_TRUE(at::equal(with_grad.detach(), without));
}

// A frozen output layer (LoRA's base, a tied embedding left out of training) gets no gradient and
// costs none: h's gradient is the one a trainable weight gives (up to the GEMMs' rounding, which
// can follow the operands' alignment on a CPU), and no weight-sized gradient is
// ever allocated (the peak stays below one). A frozen h likewise gets none while the weight gets
// its own.
TEST(LinearCrossEntropy, AFrozenWeightOrHiddenStateGetsNoGradientAndNoGradientWork) {
  memory::CpuAllocatorGuard::instance();
  const c10::Device cpu(c10::kCPU);
  const Problem p = problem(64, 256, 4000, 4096, 6);
  const int64_t weight_bytes = 4096 * 256 * 4;
  const Result both = run(p, 16);
  const at::Tensor h = p.h.clone().requires_grad_(true);
  const at::Tensor frozen_w = p.w.clone();
  memory::reset_peaks(cpu);
  const int64_t base = memory::sample_memory(cpu).tensor_bytes;
  at::Tensor loss = linear_cross_entropy(h, frozen_w, p.targets, p.vocab, 16);
  loss.backward();
  const int64_t peak = memory::sample_memory(cpu).tensor_peak_bytes - base;
  EXPECT_LT(test::relative_error(loss.detach(), both.loss), 1e-6);
  EXPECT_LT(test::relative_error(h.grad(), both.grad_h), 1e-6);
  EXPECT_FALSE(frozen_w.grad().defined());
  EXPECT_LT(peak, weight_bytes) << "a weight-sized gradient was allocated";

  const at::Tensor w = p.w.clone().requires_grad_(true);
  const at::Tensor frozen_h = p.h.clone();
  linear_cross_entropy(frozen_h, w, p.targets, p.vocab, 16).backward();
  EXPECT_LT(test::relative_error(w.grad(), both.grad_w), 1e-6);
  EXPECT_FALSE(frozen_h.grad().defined());
}

// The reason it exists: the vocabulary-wide tensors are bounded by the chunk, not by the rows.
TEST(LinearCrossEntropy, PeakMemoryIsBoundedByTheChunk) {
  memory::CpuAllocatorGuard::instance();  // CPU tensor bytes are counted once it is installed
  const c10::Device cpu(c10::kCPU);
  const Problem p = problem(512, 32, 4000, 4096, 4);
  const auto peak = [&](int64_t chunk_rows) {
    const at::Tensor h = p.h.clone().requires_grad_(true), w = p.w.clone().requires_grad_(true);
    memory::reset_peaks(cpu);
    const int64_t base = memory::sample_memory(cpu).tensor_bytes;
    if (chunk_rows < 0) {
      at::cross_entropy_loss(at::linear(h, w).narrow(1, 0, p.vocab), p.targets).backward();
    } else {
      linear_cross_entropy(h, w, p.targets, p.vocab, chunk_rows).backward();
    }
    return memory::sample_memory(cpu).tensor_peak_bytes - base;
  };
  peak(-1);  // warm-up
  const int64_t unfused = peak(-1), fused = peak(32);
  const int64_t logits = 512 * 4096 * 4;
  std::printf("forward + backward peak: %.2f MiB unfused, %.2f MiB in chunks of 32 rows "
              "(the whole fp32 logits: %.2f MiB)\n",
              double(unfused) / (1 << 20), double(fused) / (1 << 20), double(logits) / (1 << 20));
  EXPECT_GT(unfused, 2 * logits);
  EXPECT_LT(fused, logits / 4);
}

TEST(LinearCrossEntropy, BadInputsNameWhatIsWrong) {
  const Problem p = problem(6, 8, 10, 16, 5);
  const auto message = [&](const at::Tensor& h, const at::Tensor& t, int64_t vocab) {
    try {
      linear_cross_entropy(h, p.w, t, vocab);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(p.h.view({2, 3, 8}), p.targets, 10).find("h [rows, d]"), std::string::npos);
  EXPECT_NE(message(p.h, p.targets.narrow(0, 0, 5), 10).find("targets must be int64 [6]"),
            std::string::npos);
  EXPECT_NE(message(p.h, p.targets, 17).find("vocab 17 must be in [1, 16]"), std::string::npos);
}

}  // namespace TRAINER_UNITY_ID
