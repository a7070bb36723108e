#include "models/documents.h"

#include "models/attention_mask.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

namespace models {
namespace {

// Set by the first failure of the variable-length kernel: the masked path from then on.
std::atomic<bool> varlen_failed{false};

// FlashAttention-2's limits on a head.
bool flash_head(int64_t head_dim) { return head_dim % 8 == 0 && head_dim <= 256; }

}  // namespace

struct Documents::State {
  // The variable-length path: document starts in the rows flattened, then n T (int32, on the
  // device), and the longest document; undefined without host positions on a CUDA device.
  at::Tensor cu_seqlens;
  int64_t longest = 0;
  std::mutex mutex;  // the masks below are made on first use (forward, or a recomputation)
  // 0 where allowed, -inf elsewhere [n, 1, T, T], per window (0: none) and dtype.
  std::map<std::pair<int64_t, at::ScalarType>, at::Tensor> additive;
};

namespace {

// cu_seqlens and the longest document of host `positions` [n, T] (flattened row after row; a
// row begins a document).
std::pair<at::Tensor, int64_t> starts_on_host(const at::Tensor& positions) {
  const at::Tensor p = positions.contiguous();
  const int64_t n = p.size(0), t = p.size(1);
  const int64_t* v = p.data_ptr<int64_t>();
  std::vector<int32_t> starts;
  int64_t longest = 0;
  for (int64_t i = 0; i < n * t; ++i) {
    if (i % t == 0 && v[i] != 0) {
      throw std::invalid_argument(
          fmt::format("packed documents: row {} begins at position {}, not 0", i / t, v[i]));
    }
    if (v[i] == 0) starts.push_back(static_cast<int32_t>(i));
    longest = std::max(longest, v[i] + 1);
  }
  starts.push_back(static_cast<int32_t>(n * t));
  at::Tensor cu = at::empty({static_cast<int64_t>(starts.size())}, at::kInt);
  std::copy(starts.begin(), starts.end(), cu.data_ptr<int32_t>());
  return {cu, longest};
}

}  // namespace

Documents::Documents(const at::Tensor& positions, c10::Device device)
    : state_(std::make_shared<State>()) {
  if (positions.dim() != 2 || positions.scalar_type() != at::kLong) {
    throw std::invalid_argument(
        fmt::format("packed documents: positions must be int64 [n, T], got {} {}",
                    c10::toString(positions.scalar_type()), positions.sizes()));
  }
  if (device.is_cuda() && positions.is_cpu() &&
      positions.numel() < std::numeric_limits<int32_t>::max()) {
    auto [cu, longest] = starts_on_host(positions);
    state_->cu_seqlens = cu.pin_memory().to(device, /*non_blocking=*/true);
    state_->longest = longest;
  }
  positions_ = positions.device() == device
                   ? positions
                   : positions.to(device, /*non_blocking=*/positions.is_pinned());
}

at::Tensor Documents::mask_of(const at::Tensor& positions) { return document_mask(positions, 0); }

at::Tensor Documents::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double dropout, int64_t window, std::optional<double> scale) const {
  const at::ScalarType dtype = q.scalar_type();
  if (state_->cu_seqlens.defined() && q.is_cuda() && !varlen_failed.load() &&
      (dtype == at::kHalf || dtype == at::kBFloat16) && flash_head(q.size(-1))) {
    try {
      return varlen(q, k, v, dropout, window, scale);
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const c10::Error& e) {
      if (!varlen_failed.exchange(true)) {
        spdlog::warn("packed documents: the variable-length attention kernel failed ({}); "
                     "attending through the block-diagonal mask from now on",
                     e.what_without_backtrace());
      }
    }
  }
  return masked(q, k, v, dropout, window, scale);
}

at::Tensor Documents::varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double dropout, int64_t window, std::optional<double> scale) const {
  const int64_t n = q.size(0), heads = q.size(1), t = q.size(2), hd = q.size(3);
  // [n, heads, T, hd] -> [n T, heads, hd]: one sequence of every row, cut at cu_seqlens.
  const auto flat = [&](const at::Tensor& z) {
    return z.transpose(1, 2).reshape({n * t, z.size(1), hd});
  };
  const at::Tensor& cu = state_->cu_seqlens;
  const int64_t longest = state_->longest;
  const at::Tensor out = std::get<0>(at::_flash_attention_forward(
      flat(q), flat(k), flat(v), cu, cu, longest, longest, dropout, /*is_causal=*/true,
      /*return_debug_mask=*/false, scale,
      window > 0 ? std::optional<int64_t>(window - 1) : std::nullopt,
      window > 0 ? std::optional<int64_t>(0) : std::nullopt));
  return out.view({n, t, heads, hd}).transpose(1, 2);
}

at::Tensor Documents::masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double dropout, int64_t window, std::optional<double> scale) const {
  at::Tensor mask;
  {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    at::Tensor& additive = state_->additive[{window, q.scalar_type()}];
    if (!additive.defined()) {
      const at::Tensor allowed = document_mask(positions_, window);
      additive = at::zeros(allowed.sizes(), q.options())
                     .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    }
    mask = additive;
  }
  return at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/false, scale,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
}

}  // namespace models
