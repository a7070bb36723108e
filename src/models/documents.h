// Documents: the attention layout of packed documents (models::PackedDocuments, data.packing:
// documents). A row of a batch holds several documents one after another; `positions` int64
// [n, T] gives each token's position within its document (0 at a document's first token), so
// token i may attend token j iff j <= i and j >= i - positions[i] (block-diagonal causal
// attention), and positions[i] is its position id (learned or rotary). A row's tail of padding is
// one more document (positions 0, 1, ...), so every token attends at least itself.
//
// Built once per forward (make_documents) and shared by every block, which calls
// document_attention. Two paths, the same numbers up to rounding:
//   variable-length  CUDA, fp16/bf16 queries, head_dim a multiple of 8 up to 256, positions given
//                    on the host: FlashAttention-2's variable-length kernel
//                    (at::_flash_attention_forward with cu_seqlens, its backward through
//                    autograd): the rows flattened into one sequence of n T tokens cut at the
//                    document starts. Only the documents' own blocks are computed. The starts
//                    are found on the host (positions live there before the copy), so nothing
//                    waits for the device; cu_seqlens go over in pinned memory.
//   masked           everywhere else (CPU, fp32, positions on the device, a GPU without
//                    FlashAttention): scaled_dot_product_attention with the block-diagonal mask
//                    [n, 1, T, T], built once per forward on the device, as an additive float
//                    mask of the queries' dtype (as cheap as a boolean one on the CPU; at 1024
//                    positions of about 10 documents a loop over the documents is cheaper, at 256
//                    dearer: bench/RESULTS.md, "Packed documents: block-diagonal attention").
// The variable-length path is compiled in every build but has not run on a GPU yet (no GPU here);
// a first failure of the kernel (say, a GPU FlashAttention does not support) is logged once and
// the masked path serves from then on.
//
// Incremental decoding (KV caches) never takes packed documents: generation is one document.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace models {

class Documents {
 public:
  Documents() = default;
  // `positions` int64 [n, T], on the CPU or on `device` (the model's). Throws
  // std::invalid_argument for another shape or dtype.
  Documents(const at::Tensor& positions, c10::Device device);

  // The position ids, int64 [n, T] on the model's device.
  const at::Tensor& positions() const { return positions_; }

  // Attention of q [n, heads, T, head_dim] over k, v [n, kv_heads, T, head_dim] (kv_heads
  // dividing heads), block-diagonal causal, within a sliding `window` when > 0
  // (models/attention_mask.h), scale 1 / sqrt(head_dim) unless given, dropout p on the
  // probabilities: [n, heads, T, head_dim].
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                    int64_t window = 0, std::optional<double> scale = std::nullopt) const;

  // The block-diagonal causal mask, bool [n, 1, T, T] on `positions`' device: true where query i
  // may attend key j (models::document_mask without a window).
  static at::Tensor mask_of(const at::Tensor& positions);

 private:
  at::Tensor varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                    int64_t window, std::optional<double> scale) const;
  at::Tensor masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                    int64_t window, std::optional<double> scale) const;

  // The layout's tensors, shared by the copies each block (and each recomputation of an
  // activation-checkpointed block) holds.
  struct State;
  at::Tensor positions_;
  std::shared_ptr<State> state_;
};

}  // namespace models
