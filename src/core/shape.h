// core::Shape: what a model must know of its data. Every dataset returns one (data::Dataset::
// shape()) and the model registry builds a model from it (models::create_model), so data/ and
// models/ meet here without knowing each other. Fields that do not apply to a dataset are zero
// (item_text: undefined). A new fact a model needs from the data is a field here, set by the
// datasets that have it and read by the registry's factories.
//
// src/core/ is the bottom layer: header-only, it includes nothing of the project (docs/DESIGN.md,
// "Layers").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace core {

// Byte-level texts (Shape::item_text): ids 0..255 are the bytes, and this id pads a text to its
// fixed length. The data that writes such texts and the model that reads them both use it.
inline constexpr int64_t kTextPadId = 256;

// The target of a position the loss does not count (a masked token, padding, a document's last
// position): PyTorch's and Hugging Face's ignore_index. Token data writes it (data/token_shards.h),
// the language models' losses skip it.
inline constexpr int64_t kIgnoreTarget = -100;

struct Shape {
  // Classification (synthetic; mlp): feature count and classes.
  int64_t input_dim = 0;
  int64_t num_classes = 0;
  // Id-based data (movielens; recommender): users, items and each item's text, int64
  // [num_items, text_len], padded with kTextPadId.
  int64_t num_users = 0;
  int64_t num_items = 0;
  at::Tensor item_text;
  // Tokens (token shards; gpt): ids below vocab_size, `context` positions per sample.
  int64_t vocab_size = 0;
  int64_t context = 0;
  // Time series (csv; sequence): a window of `window` steps of `features` columns predicts
  // `horizon` steps of `targets` columns.
  int64_t window = 0;
  int64_t features = 0;
  int64_t horizon = 0;
  int64_t targets = 0;
  // Images (images; cnn): channels, and the upscaling factor from input to target (1: denoising).
  int64_t channels = 0;
  int64_t scale = 0;
};

}  // namespace core
