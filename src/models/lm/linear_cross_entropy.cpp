#include "models/lm/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "core/shape.h"  // kIgnoreTarget

namespace models {
namespace {

constexpr int64_t kChunkBytes = int64_t{256} << 20;  // one chunk's fp32 logits

struct Parts {
  at::Tensor loss;    // fp32, 0-dim: the sum over the counted rows / max(their number, 1)
  at::Tensor count;   // fp32, 0-dim: max(the counted rows, 1)
  at::Tensor grad_h;  // d (sum over rows) / d h, h's dtype (when asked for)
  at::Tensor grad_w;  // d (sum over rows) / d weight, weight's dtype (when asked for)
};

// The dtype of the two matmuls: autocast's where it is on for h's device (as autocast would run
// `linear`), h's own otherwise. Read before autocast's dispatch keys are excluded below, since
// is_autocast_enabled is the absence of that exclusion.
at::ScalarType matmul_dtype(const at::Tensor& h) {
  const auto type = h.device().type();
  if (at::autocast::is_autocast_enabled(type)) return at::autocast::get_autocast_dtype(type);
  return h.scalar_type();
}

// Note [Chunked output layer]
// Per chunk of rows: the logits by a matmul in the matmul dtype, cast to fp32; the padded columns
// set to -inf (exp gives 0: they leave the softmax and get a zero gradient); their log-softmax,
// which gives the loss by a gather at the targets; then, for a gradient, d (loss sum) / d logits =
// softmax - one-hot in the matmul dtype, and two matmuls that turn it into the chunk's rows of
// d/dh and its addition to d/dweight (each only for an input that requires a gradient). Every
// tensor of vocabulary width is released before the next chunk. The loss sum is divided by the
// row count here, the gradients' sums in backward.
//
// Ignored rows (target core::kIgnoreTarget) look up target 0 instead, so that every op keeps its
// shape, and are weighted 0 where it is cheap, in tensors of rows rather than of vocabulary
// width: their log p in the loss sum, their rows of d/dh, and their rows of h in d/dweight's
// matmul (g^T h: a zero row of h adds nothing, whatever g's row holds). A counted row's weight is
// exactly 1, so without ignored targets every number is bit for bit what it was without the
// weighting. The count divides on the device, as a tensor.
//
// Memory traffic per logit (bf16): the product written (2 bytes) and cast (2 + 4), the
// log-softmax (4 + 4), the gradient written (4 + 2) and read by two matmuls (2 + 2): 26 bytes,
// where linear + cross_entropy under autocast moves about 58 (the copy without the padded
// columns, the fp32 cast, log_softmax, nll_loss's fp32 gradient, log_softmax's backward, the cast
// back, the padded copy's backward). What chunking adds: each chunk reads and writes the fp32
// weight gradient once (4 x rows x d bytes per chunk, against the chunk's 26 x rows x vocab).
//
// The memory plan's probe (two micro-batches, a straight line through their peaks) sees this
// transient grow with the rows until one chunk is full, and constant after; when the probe's
// micro-batches are below one chunk the line overestimates larger ones, by at most what the
// unchunked loss really used.

// Which gradients run() computes: none (the loss alone), or d/dh, d/dweight or both. A frozen
// output layer (LoRA's base, a frozen tied embedding) asks for d/dh alone: no [vocab, d] matmul
// and accumulation per chunk, which at Llama-3.2-1B's vocabulary was a sixth of a LoRA step.
struct Wanted {
  bool h = false, weight = false;
  bool any() const { return h || weight; }
};

// grad_w += g^T hk, g and hk in the matmul dtype.
void add_weight_gradient(at::Tensor& grad_w, const at::Tensor& g, const at::Tensor& hk) {
  if (g.scalar_type() == grad_w.scalar_type()) {
    grad_w.addmm_(g.t(), hk);
  } else if (grad_w.is_cuda() && grad_w.scalar_type() == at::kFloat) {
    // bf16/fp16 operands into the float32 gradient in the GEMM itself (cuBLAS's accumulator,
    // beta = 1): no [vocab, d] product rounded to the low precision and added by a second,
    // mixed-dtype pass (at Llama-3.2-1B's vocabulary 71 ms of a 649 ms full step on an H200).
    at::addmm_out(grad_w, grad_w, g.t(), hk, at::kFloat);
  } else {
    grad_w.add_(at::mm(g.t(), hk));  // the CPU has no mixed-dtype GEMM
  }
}

Parts run(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& targets, int64_t vocab,
          int64_t chunk_rows, Wanted wanted) {
  const at::ScalarType dtype = matmul_dtype(h);
  // The dtypes are chosen here, explicitly; autocast must not re-cast the ops below.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t rows = h.size(0), padded = weight.size(0);
  const at::Tensor hc = h.to(dtype), wc = weight.to(dtype);
  const at::Tensor counted = targets.ne(core::kIgnoreTarget).reshape({rows, 1});
  const at::Tensor index = at::where(counted, targets.reshape({rows, 1}), 0);
  const at::Tensor keep = counted.to(at::kFloat), keep_mm = counted.to(dtype);
  Parts p;
  p.loss = at::zeros({}, h.options().dtype(at::kFloat));
  p.count = keep.sum().clamp_min(1.0);
  if (wanted.h) p.grad_h = at::empty(h.sizes(), h.options());
  if (wanted.weight) p.grad_w = at::zeros(weight.sizes(), weight.options());
  const int64_t step = linear_cross_entropy_chunk_rows(rows, padded, chunk_rows);
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    const at::Tensor hs = hc.narrow(0, start, n);
    const at::Tensor ts = index.narrow(0, start, n);
    const at::Tensor ks = keep.narrow(0, start, n), ks_mm = keep_mm.narrow(0, start, n);
    at::Tensor logp;
    {
      // [n, padded], in fp32 from here on (the lower-precision product is released at once).
      at::Tensor logits = at::mm(hs, wc.t()).to(at::kFloat);
      if (padded > vocab) {
        logits.narrow(1, vocab, padded - vocab).fill_(-std::numeric_limits<double>::infinity());
      }
      logp = at::_log_softmax(logits, 1, /*half_to_float=*/false);
    }
    const at::Tensor picked = logp.gather(1, ts);  // [n, 1]: log p of each target
    p.loss.sub_((picked * ks).sum());
    if (!wanted.any()) continue;
    // softmax - one-hot, written once in the matmul dtype: exp of the log-softmax, cast as it is
    // stored; then each target's entry, p_t - 1 = expm1(log p_t), computed in fp32 (rounding p_t
    // first would lose most of a confident prediction's gradient, 1 - p_t).
    at::Tensor g;
    if (dtype == at::kFloat) {
      g = logp.exp_();
    } else {
      g = at::empty(logp.sizes(), hs.options());
      at::exp_out(g, logp);
    }
    logp.reset();
    g.scatter_(1, ts, at::expm1(picked).to(dtype));
    if (wanted.h) p.grad_h.narrow(0, start, n).copy_(at::mm(g, wc) * ks_mm);
    if (!wanted.weight) continue;
    add_weight_gradient(p.grad_w, g, hs * ks_mm);
  }
  p.loss.div_(p.count);
  return p;
}

struct LinearCrossEntropy final : torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const at::Tensor& weight, const at::Tensor& targets, int64_t vocab,
                            int64_t chunk_rows) {
    // The flags are the inputs' own (the forward runs without grad mode, not without them).
    Parts p = run(h, weight, targets, vocab, chunk_rows,
                  Wanted{.h = h.requires_grad(), .weight = weight.requires_grad()});
    ctx->saved_data["grad_h"] = std::move(p.grad_h);
    ctx->saved_data["grad_w"] = std::move(p.grad_w);
    ctx->saved_data["count"] = std::move(p.count);
    return p.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The loss is a scalar, so its gradients are the saved sums times the incoming scalar over
    // the count of rows the loss counts.
    const at::Tensor grad_h = ctx->saved_data.at("grad_h").toTensor();
    const at::Tensor grad_w = ctx->saved_data.at("grad_w").toTensor();
    const at::Tensor scale = grads.at(0) / ctx->saved_data.at("count").toTensor();
    return {grad_h.defined() ? grad_h * scale : at::Tensor(),
            grad_w.defined() ? grad_w * scale : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

void require_lce(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("linear_cross_entropy: " + message);
}

}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t padded_vocab, int64_t chunk_rows) {
  if (rows <= 0) return 1;
  if (chunk_rows <= 0) {
    chunk_rows = std::max<int64_t>(1, kChunkBytes / (std::max<int64_t>(1, padded_vocab) * 4));
  }
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  return (rows + chunks - 1) / chunks;
}

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                const at::Tensor& targets, int64_t vocab, int64_t chunk_rows) {
  require_lce(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1),
              fmt::format("h [rows, d] and weight [vocab, d] expected, got {} and {}", h.sizes(),
                          weight.sizes()));
  require_lce(
      targets.dim() == 1 && targets.size(0) == h.size(0) && targets.scalar_type() == at::kLong,
      fmt::format("targets must be int64 [{}], got {} {}", h.size(0),
                  c10::toString(targets.scalar_type()), targets.sizes()));
  require_lce(
      vocab >= 1 && vocab <= weight.size(0),
      fmt::format("vocab {} must be in [1, {}] (the weight's rows)", vocab, weight.size(0)));
  require_lce(h.size(0) >= 1, "no rows");
  if (at::GradMode::is_enabled() && (h.requires_grad() || weight.requires_grad())) {
    return LinearCrossEntropy::apply(h, weight, targets, vocab, chunk_rows);
  }
  return run(h, weight, targets, vocab, chunk_rows, Wanted{}).loss;
}

}  // namespace models
