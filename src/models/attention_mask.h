// Which keys a query attends, for every attention in models/: one rule for the causal decoders,
// combined where several parts apply.
//
//   causal          query i (at position p_i) attends keys at positions <= p_i;
//   sliding window  ... and > p_i - window (window > 0: the `window` latest positions, its own
//                   included, as transformers' sliding_window);
//   documents       ... and within its own packed document (models/documents.h: positions[i] is
//                   i's position in its document, so keys i - positions[i] .. i).
//
// A KV cache shifts the queries: the T queries are positions past .. past + T - 1 over past + T
// keys. The kernels take the rule as is_causal when it is plain causal over as many keys as
// queries (no mask made), else as a boolean mask [T, keys] (or [n, 1, T, T] with documents) that
// scaled_dot_product_attention reads; FlashAttention-2's variable-length kernel takes the window
// as window_size_left = window - 1 (models/documents.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>

namespace models {

// True when the causal rule with `window` over `queries` queries after `past` cached keys needs a
// mask: keys outnumber queries (past > 0 and queries > 1), or the window is shorter than the keys.
bool needs_causal_mask(int64_t queries, int64_t past, int64_t window);

// bool [queries, past + queries] on `options`' device: true where query i (position past + i)
// may attend key j (j <= past + i, and j > past + i - window when window > 0).
at::Tensor causal_mask(int64_t queries, int64_t past, int64_t window,
                       const at::TensorOptions& options);

// bool [n, 1, T, T]: packed documents' block-diagonal causal rule for `positions` int64 [n, T]
// (models/documents.h), within `window` when window > 0.
at::Tensor document_mask(const at::Tensor& positions, int64_t window);

}  // namespace models
