#include "models/recommender.h"

#include "models/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

namespace models {
namespace {

// Items encoded per forward of the text encoder: bounds the activation memory of building the
// cache, of uncached micro-batches and of score_all ([chunk, heads, L, L] attention scores).
constexpr int64_t kEncodeChunk = 1024;
// Small initial embeddings keep the first scores near 0 (sigmoid unsaturated); LibTorch's N(0, 1)
// would give dot products of size sqrt(d).
constexpr double kEmbeddingInitStd = 0.1;

void require_recommender(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("recommender: " + what);
}

}  // namespace

Recommender::Recommender(int64_t num_users, int64_t num_items, const at::Tensor& item_text,
                         const RecommenderOptions& o)
    : num_users_(num_users), num_items_(num_items) {
  require_recommender(num_users > 0, fmt::format("needs at least one user, got {}", num_users));
  require_recommender(num_items > 0, fmt::format("needs at least one item, got {}", num_items));
  require_recommender(o.embedding_dim > 0,
                      fmt::format("embedding_dim must be positive, got {}", o.embedding_dim));
  require_recommender(o.mlp_depth >= 0, fmt::format("mlp_depth must be >= 0, got {}", o.mlp_depth));
  require_recommender(o.mlp_depth == 0 || o.mlp_hidden > 0,
                      fmt::format("mlp_hidden must be positive, got {}", o.mlp_hidden));
  require_recommender(
      item_text.defined(),
      "needs item texts (a dataset with users, items and item metadata, such as movielens)");
  require_recommender(item_text.dim() == 2 && item_text.scalar_type() == at::kLong,
                      fmt::format("item_text must be int64 [num_items, L], got {} {}",
                                  c10::toString(item_text.scalar_type()), item_text.sizes()));
  require_recommender(
      item_text.size(0) == num_items,
      fmt::format("item_text has {} rows for {} items", item_text.size(0), num_items));
  require_recommender(
      item_text.size(1) <= o.encoder.max_len,
      fmt::format("item texts are {} tokens long but the encoder's max_len (text_len) is {}",
                  item_text.size(1), o.encoder.max_len));
  const at::Tensor text = item_text.to(at::kCPU).contiguous().clone();
  if (text.numel() > 0) {
    const int64_t lo = text.min().item<int64_t>();
    const int64_t hi = text.max().item<int64_t>();
    require_recommender(
        lo >= 0 && hi <= TextEncoder::kPadId,
        fmt::format("item_text holds token {} outside 0..{} (bytes and the padding id)",
                    lo < 0 ? lo : hi, TextEncoder::kPadId));
  }

  const int64_t d = o.embedding_dim;
  user_embedding_ = register_module("user_embedding", torch::nn::Embedding(num_users, d));
  item_embedding_ = register_module("item_embedding", torch::nn::Embedding(num_items, d));
  {
    at::NoGradGuard no_grad;
    user_embedding_->weight.normal_(0.0, kEmbeddingInitStd);
    item_embedding_->weight.normal_(0.0, kEmbeddingInitStd);
  }
  tower_ = register_module("tower", torch::nn::ModuleList());
  int64_t width = d + o.encoder.out_dim;
  for (int64_t i = 0; i < o.mlp_depth; ++i) {
    tower_->push_back(torch::nn::Linear(width, o.mlp_hidden));
    width = o.mlp_hidden;
  }
  tower_->push_back(torch::nn::Linear(width, d));

  encoder_ = register_module("text_encoder", std::make_shared<TextEncoder>(o.encoder));
  if (!o.encoder_weights.empty()) encoder_->load_safetensors(o.encoder_weights);
  item_text_ = register_buffer("item_text", text);
  item_cache_ = register_buffer(
      "item_cache", at::empty({0, o.encoder.out_dim}, at::TensorOptions().dtype(at::kFloat)));
}

at::Tensor Recommender::encode(const at::Tensor& items) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < items.size(0); start += kEncodeChunk) {
    const at::Tensor chunk = items.narrow(0, start, std::min(kEncodeChunk, items.size(0) - start));
    parts.push_back(encoder_->forward(item_text_.index_select(0, chunk)));
  }
  if (parts.empty()) return encoder_->forward(item_text_.narrow(0, 0, 0));
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

void Recommender::build_cache() {
  cached_ = true;
  at::NoGradGuard no_grad;
  // Drop the old cache first so the peak is one cache, not two.
  item_cache_.set_data(at::empty({0, item_cache_.size(1)}, item_cache_.options()));
  item_cache_.set_data(encode(at::arange(num_items_, item_text_.options())));
}

bool Recommender::uncache() {
  const bool was_cached = cached_;
  cached_ = false;
  at::NoGradGuard no_grad;
  // set_data, not assignment: the registered buffer and this handle share one TensorImpl, and
  // the storage must actually be dropped for the memory to come back.
  item_cache_.set_data(at::empty({0, item_cache_.size(1)}, item_cache_.options()));
  return was_cached;
}

at::Tensor Recommender::metadata(const at::Tensor& items) {
  auto shape = items.sizes().vec();
  shape.push_back(item_cache_.size(1));
  const at::Tensor flat = items.reshape({-1});
  if (cached_) {
    if (!cache_built()) build_cache();
    return item_cache_.index_select(0, flat).view(shape);
  }
  // Each distinct item once: a positive often reappears as another sample's negative.
  const auto [unique, inverse] = at::_unique(flat, /*sorted=*/true, /*return_inverse=*/true);
  return encode(unique).index_select(0, inverse).view(shape);
}

at::Tensor Recommender::tower(const at::Tensor& id_embedding, const at::Tensor& meta) {
  at::Tensor x = at::cat({id_embedding, meta}, -1);
  const size_t last = tower_->size() - 1;
  for (size_t i = 0; i < tower_->size(); ++i) {
    x = linear(*tower_[i]->as<torch::nn::Linear>(), x);
    if (i != last) x = gelu(x, GeluApprox::kNone);
  }
  return x;
}

at::Tensor Recommender::forward(const at::Tensor& inputs) {
  require_recommender(inputs.dim() == 2 && inputs.size(1) >= 2 && inputs.scalar_type() == at::kLong,
                      fmt::format("inputs must be int64 [n, 1 + k] (user, items...), got {} {}",
                                  c10::toString(inputs.scalar_type()), inputs.sizes()));
  const at::Tensor users = inputs.select(1, 0);
  const at::Tensor items = inputs.narrow(1, 1, inputs.size(1) - 1);              // [n, k]
  const at::Tensor u = user_embedding_->forward(users);                          // [n, d]
  const at::Tensor v = tower(item_embedding_->forward(items), metadata(items));  // [n, k, d]
  return (v * u.unsqueeze(1)).sum(-1);
}

at::Tensor Recommender::loss(const at::Tensor& inputs, const at::Tensor& /*targets*/) {
  require_recommender(
      inputs.dim() == 2 && inputs.size(1) == 3,
      fmt::format("loss needs inputs [n, 3] (user, positive, negative), got {}", inputs.sizes()));
  const at::Tensor s = forward(inputs);
  return -at::log_sigmoid(s.select(1, 0) - s.select(1, 1)).mean();
}

at::Tensor Recommender::score_all(const at::Tensor& users) {
  at::NoGradGuard no_grad;
  const at::Tensor u = user_embedding_->forward(users.reshape({-1}));  // [u, d]
  const bool use_cache = cached_ && cache_built();
  std::vector<at::Tensor> columns;
  for (int64_t start = 0; start < num_items_; start += kEncodeChunk) {
    const int64_t n = std::min(kEncodeChunk, num_items_ - start);
    const at::Tensor items = at::arange(start, start + n, item_text_.options());
    const at::Tensor meta = use_cache ? item_cache_.narrow(0, start, n) : encode(items);
    const at::Tensor v = tower(item_embedding_->forward(items), meta);  // [n, d]
    columns.push_back(at::matmul(u, v.t()));
  }
  return columns.size() == 1 ? columns[0] : at::cat(columns, 1);
}

}  // namespace models
