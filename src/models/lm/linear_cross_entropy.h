// linear_cross_entropy: the mean cross-entropy of logits = h @ weight^T against targets, computed
// in chunks of rows so that the full [rows, vocab] logits are never held at once.
//
//   loss = sum_{i in R} ( logsumexp_j<vocab (h_i . w_j) - h_i . w_{target_i} ) / max(|R|, 1)
//
// where R is the rows whose target is not core::kIgnoreTarget (-100: masked tokens, a packed
// document's last position, padding; PyTorch's ignore_index). The count |R| stays on the device
// (no host synchronisation); a batch without targets gives loss 0 and zero gradients. An ignored
// row costs the same as a counted one (its logits are made: skipping it would need the count on
// the host), but takes no part in the loss or either gradient.
//
// A language model's output layer is where its memory goes: GPT-2 at 16 x 1024 tokens has
// 16,384 x 50,304 logits, 1.5 GiB in bf16, and the unfused path (matmul, copy without the padded
// columns, cast to fp32, log_softmax, then the backward of each) holds several copies of that and
// streams them through memory about ten times. Here each chunk of rows makes its logits, their
// log-softmax in fp32 and, when a gradient is wanted, the gradient of the loss with respect to
// them (softmax - one-hot), which it turns straight into its share of the gradients of h and of
// the weight; the chunk's logits are then dropped. Forward therefore returns the loss with both
// gradients already computed (saved for backward, which only scales them by the incoming
// gradient), as Liger-Kernel's fused linear cross-entropy does, and nothing of size vocab outlives
// a chunk.
//
// Rows of `weight` at and beyond `vocab` (padding to a fast matmul width) are masked out of the
// softmax: never predicted, never a target, and their gradient is exactly zero.
//
// Precision follows autocast: with autocast on for h's device the matmuls run in its dtype (bf16
// or fp16), and the log-softmax, the loss and the gradient of the logits are computed in fp32,
// the last stored in the matmul dtype for the backward matmuls, as autocast runs `linear` then
// `cross_entropy`; otherwise everything is in h's dtype. The weight's gradient is accumulated
// over chunks in the weight's dtype: on CUDA a float32 weight's by the GEMM itself (addmm with a
// float32 out_dtype), each chunk's low-precision product never rounded; on the CPU, which has no
// such GEMM, that product is added.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace models {

// Rows per chunk when the caller passes 0: as many as keep one chunk's fp32 logits within
// 256 MiB, spread evenly over the chunks.
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t padded_vocab, int64_t chunk_rows = 0);

// h [rows, d], weight [padded_vocab, d] (padded_vocab >= vocab), targets int64 [rows], each below
// vocab or core::kIgnoreTarget. Returns the loss above (fp32, 0-dim), differentiable with respect
// to h and weight when grad mode is on and either requires a gradient.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                const at::Tensor& targets, int64_t vocab, int64_t chunk_rows = 0);

}  // namespace models
