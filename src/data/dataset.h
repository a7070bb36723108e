// Dataset: samples addressed by index. Datasets know nothing of ranks: the sampler (ddp) decides
// which indices a rank reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"

namespace data {

// One sample batch on the host, in index order. Dim 0 is the sample; the rest depends on the data:
//   synthetic  inputs float [n, input_dim]; targets int64 [n] class ids
//   movielens  inputs int64 [n, 3] (user, pos, neg); targets int64 [n] zeros
//   tokens     inputs int64 [n, context]; targets int64 [n, context]: the next token, or
//              core::kIgnoreTarget where the loss must not count it (data/token_shards.h)
//   csv        inputs float [n, window, features]; targets float [n, horizon, targets]
//   images     inputs float [n, C, p/scale, p/scale]; targets float [n, C, p, p], in [0, 1]
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  // Packed documents (tokens with data.packing: documents): int64 [n, context], each input's
  // position within its document, 0 at the document's first token. Token i may attend token j
  // iff j <= i and j >= i - positions[i] (block-diagonal causal attention), and positions[i] is
  // its position id (learned or rotary). Undefined for every other batch (the initialiser lets
  // {inputs, targets} build one without a warning).
  at::Tensor positions{};
  // Preference pairs (tokens with NAME.pairs): int64 [n], the pairs' indices in their split (the
  // key of a table of reference log-probabilities); inputs and targets are then [n, 2, context].
  // Undefined for every other batch.
  at::Tensor pairs{};
};

// data.packing (token shards): documents fills each window with whole documents (needs the
// shards' document boundaries); none cuts windows from the token stream; auto is documents when
// the shards carry boundaries and none otherwise (data/token_shards.h).
enum class Packing { kAuto, kDocuments, kNone };
inline constexpr std::array<const char*, 3> kPackingNames = {"auto", "documents", "none"};

// What a token dataset's windows hold, over the whole split: its packing efficiency, for one log
// line (packing_line). Dataset::packing() returns it.
struct PackingStats {
  Packing packing = Packing::kNone;  // documents or none (auto resolved)
  int64_t windows = 0;
  int64_t context = 0;          // positions per window
  int64_t documents = 0;        // in the shards (0 without boundaries)
  int64_t split_documents = 0;  // longer than the context, so split into pieces (documents)
  int64_t pieces = 0;           // the pieces those were split into
  int64_t tokens = 0;           // positions holding a token (not padding), over all windows
  int64_t targets = 0;          // targets the loss counts (not core::kIgnoreTarget)
};

// "data.packing: documents: 1200 documents in 300 windows of 1024 positions: tokens 97.1%,
// targets 41.0% of the positions; 3 documents longer than data.context split into 8 pieces".
std::string packing_line(const PackingStats& stats);

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

class Dataset;

// One source of a mixture (data.mixture, data/mixture.h): its samples are indices
// [first, first + size) of the mixture, which the sampler draws by weight (ddp/rank_sampler.h),
// and it has a validation split of its own.
struct SourceInfo {
  std::string name;
  double weight = 0;                          // normalised: the weights sum to 1
  int64_t first = 0;                          // its first index in the mixture
  int64_t size = 0;                           // its training windows
  std::shared_ptr<const Dataset> validation;  // its held-out split, or nullptr
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
  // The number of targets the loss counts in the samples at `indices` (int64, CPU), without
  // reading them: what normalises a loss summed over a global batch. Token data: the targets
  // that are not core::kIgnoreTarget (an index built at open); every other dataset: one per
  // sample. Cheap (a lookup per index) and safe from several threads.
  virtual int64_t target_count(const at::Tensor& indices) const { return indices.numel(); }
  // Token data with a loss mask or document boundaries: what its windows hold (PackingStats);
  // nullopt for every other dataset.
  virtual std::optional<PackingStats> packing() const { return std::nullopt; }
  // The held-out split, evaluated every train.eval_every steps; nullptr where there is none.
  virtual std::shared_ptr<const Dataset> validation() const { return nullptr; }
  // The held-out ranking task, evaluated every train.eval_every steps; nullopt where there is none.
  virtual std::optional<RankingTask> ranking_task() const { return std::nullopt; }
  // A mixture's sources, in data.mixture's order (the sampler draws them by weight instead of
  // permuting the whole: ddp/rank_sampler.h); empty for every other dataset.
  virtual std::vector<SourceInfo> sources() const { return {}; }
};

// data.mixture: a token source (a folder of shards, its validation shards beside them), its
// weight and its name (data/mixture.h).
struct MixtureSource {
  std::string path;
  double weight = 0;
  std::string name;
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
  Packing packing{};
  std::string preference;  // train.objective when it reads pairs (dpo, simpo); "" for lm
  std::vector<MixtureSource> mixture;  // tokens: several sources by weight (empty: data.path)
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
