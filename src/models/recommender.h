// Recommender: a two-tower BPR recommender whose item tower also sees the item's text, encoded by
// a frozen TextEncoder.
//
//   user vector  u = user_embedding[user]                                   [d]
//   item vector  v = tower([item_embedding[item], meta[item]])             [d]
//   meta[item]     = text_encoder(item_text[item])  (frozen, no gradient)   [d_meta]
//   score(user, item) = u . v
//   loss = BPR = -mean(log sigmoid(score(user, pos) - score(user, neg)))
// where tower is `mlp_depth` x (Linear -> GELU) then Linear to d.
//
// Trainable parameters: the two embeddings and the tower, nothing else. The text encoder's
// weights, the item texts and the metadata cache are buffers (see text_encoder.h for why), so
// `.to(device)` moves them, `parameters()` leaves them out, and the trainer's buffer broadcast
// sends them (they are equal on every rank anyway: seeded, or loaded from the same file).
// Move the model by device only: Module::to(dtype) would cast the int64 item texts too.
//
// Metadata cache. Cached mode (the default): meta comes from a [num_items, d_meta] buffer holding
// every item's encoding; `build_cache()` fills it (under no-grad, in chunks, on the model's
// device). Call it after moving the model to its device and before the first step, so the cache
// is part of the persistent memory (docs/DESIGN.md, "The OOM protocol"); a model in cached mode
// whose cache is empty builds it on first use. Uncached mode (after `uncache()`): the cache is
// released and each micro-batch encodes only its distinct items. The encoder treats rows
// independently, so both modes give the same scores and loss (to float rounding) for the same
// weights and batch.
//
// Ids are not range-checked per step (that would synchronise with the GPU); an id out of range
// fails inside the embedding lookup. Not thread-safe (a torch::nn::Module).
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include <cstdint>
#include <memory>
#include <string>

#include "models/capabilities.h"
#include "models/model.h"
#include "models/text_encoder.h"

namespace models {

struct RecommenderOptions {
  int64_t embedding_dim = 64;   // d: user and item vectors
  int64_t mlp_hidden = 128;     // width of the tower's hidden layers
  int64_t mlp_depth = 1;        // hidden layers of the tower (0: one Linear)
  TextEncoderOptions encoder;   // max_len must be >= the item texts' width
  std::string encoder_weights;  // safetensors file for the encoder; empty: seeded random weights
};

class Recommender final : public Model, public EmbeddingCache, public ItemScorer {
 public:
  // item_text: int64 [num_items, L] (any device; copied), bytes 0..255 padded with
  // TextEncoder::kPadId. Throws std::invalid_argument for sizes or texts that do not fit
  // (naming the problem), SafetensorsError for a bad encoder_weights file.
  Recommender(int64_t num_users, int64_t num_items, const at::Tensor& item_text,
              const RecommenderOptions& options);

  // inputs: int64 [n, 1 + k] = (user, item_1 .. item_k). Returns float [n, k] scores.
  at::Tensor forward(const at::Tensor& inputs) override;
  // inputs: int64 [n, 3] = (user, positive item, negative item); targets are ignored.
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;

  // Enters cached mode and (re-)encodes every item into the cache now. Also the way to refresh
  // the cache after the encoder's weights change.
  void build_cache() override;
  // Leaves cached mode and releases the cache (the buffer becomes empty, [0, d_meta]). Returns
  // true when the model was in cached mode, false when it already was uncached.
  bool uncache() override;

  // Scores of `users` (int64 [u], model's device) against every item, [u, num_items], without
  // gradient (the ranking evaluation's hook, Model::score_all). Uses the cache when it is built,
  // else encodes items in chunks.
  at::Tensor score_all(const at::Tensor& users) override;

  bool cached() const { return cached_; }
  bool has_cache() const override { return cached_; }
  std::vector<std::string> cache_buffer_names() const override { return {"item_cache"}; }
  // Whether the cache currently holds every item's encoding.
  bool cache_built() const { return item_cache_.size(0) == num_items_; }
  int64_t num_users() const { return num_users_; }
  int64_t num_items() const { return num_items_; }
  TextEncoder& encoder() { return *encoder_; }

 private:
  // Metadata of `items` (int64, any shape): [..., d_meta], no gradient.
  at::Tensor metadata(const at::Tensor& items);
  // Encodes the texts of `items` (int64 [m]) in chunks, under no-grad: [m, d_meta].
  at::Tensor encode(const at::Tensor& items) const;
  // Item vectors from id embeddings [..., d] and metadata [..., d_meta].
  at::Tensor tower(const at::Tensor& id_embedding, const at::Tensor& meta);

  int64_t num_users_;
  int64_t num_items_;
  bool cached_ = true;
  torch::nn::Embedding user_embedding_{nullptr};
  torch::nn::Embedding item_embedding_{nullptr};
  torch::nn::ModuleList tower_{nullptr};
  std::shared_ptr<TextEncoder> encoder_;
  at::Tensor item_text_;   // buffer, int64 [num_items, L]
  at::Tensor item_cache_;  // buffer, float [num_items, d_meta] when built, else [0, d_meta]
};

}  // namespace models
