// Dataset: samples addressed by index. Datasets know nothing of ranks: the sampler (ddp) decides
// which indices a rank reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"

namespace data {

// One sample batch on the host, in index order. Dim 0 is the sample; the rest depends on the data:
//   synthetic   inputs float [n, input_dim]          targets int64 [n] class ids
//   movielens   inputs int64 [n, 3] (user, pos, neg)  targets int64 [n] zeros
//   tokens      inputs int64 [n, context]             targets int64 [n, context] (inputs shifted by
//   1) csv         inputs float [n, window, features]    targets float [n, horizon, targets] images
//   inputs float [n, C, p/scale, p/scale] targets float [n, C, p, p], values in [0, 1]
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

// A held-out ranking task (leave-last-out interaction data: movielens): each row of `held_out` is
// a user and the item its training interactions leave out; train/evaluation.h ranks that item
// among every item by the model's scores (models::Model::score_all), the user's training items
// masked, for HR@k and NDCG@k. Users are 0..num_users-1, items 0..num_items-1.
struct RankingTask {
  at::Tensor held_out;  // int64 [n, 2] (user, item) on the CPU, at most one row per user
  at::Tensor seen;      // int64 [m, 2] (user, item) on the CPU: the training interactions to mask
  int64_t num_users = 0;
  int64_t num_items = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // What a model must know of this data (core/shape.h): the model registry builds from it.
  virtual core::Shape shape() const = 0;
  // Samples at `indices` (int64, CPU), in that order, on the CPU. Safe to call from several
  // threads at once (the loader's workers): implementations are immutable after construction.
  virtual Batch get(const at::Tensor& indices) const = 0;
  // The held-out split, evaluated every train.eval_every steps; nullptr where there is none.
  virtual std::shared_ptr<const Dataset> validation() const { return nullptr; }
  // The held-out ranking task, evaluated every train.eval_every steps; nullopt where there is none.
  virtual std::optional<RankingTask> ranking_task() const { return std::nullopt; }
};

// The data section of the config (declared with defaults in config/schema_data.cpp; the
// initialisers here are only zero values).
struct DataOptions {
  std::string dataset;
  int64_t num_samples = 0;
  int64_t input_dim = 0;
  int64_t num_classes = 0;
  int64_t teacher_hidden = 0;
  double label_noise = 0.0;
  uint64_t seed = 0;
  std::string path;       // movielens: a directory; tokens: a .bin file or a directory of them;
                          // csv: a .csv file; images: a directory of .png files
  std::string val_path;   // tokens, images: the validation split (tokens: empty = the directory's
                          // files named *val*)
  int64_t text_len = 0;   // movielens: bytes of each item's text
  int64_t negatives = 0;  // movielens: samples (each with its own negative) per interaction
  // tokens
  int64_t context = 0;     // positions per sample (a window of context + 1 tokens)
  int64_t vocab_size = 0;  // token ids must be below this
  std::string
      tokenizer;  // auto | bytes | gpt2 | a tokenizer.json: the ids' encoding (data/tokenizer.h)
  // csv
  std::vector<std::string> features;  // input columns (empty: every numeric column, targets too)
  std::vector<std::string> targets;   // predicted columns
  int64_t window = 0;
  int64_t horizon = 0;
  double val_fraction = 0.0;  // csv, images: the last fraction of rows (images: files) held out
  // images
  int64_t patch_size = 0;       // target crop side, in pixels
  int64_t scale = 0;            // 1: denoise; 2 or 4: super-resolution
  double noise_std = 0.0;       // Gaussian noise added to inputs (on [0, 1] pixel values)
  int64_t crops_per_image = 0;  // samples per image per epoch
  // loader
  int64_t workers = 0;
  int64_t prefetch = 0;
  int64_t inject_read_delay_ms = 0;  // test hook: every get() sleeps this long
};

}  // namespace data
