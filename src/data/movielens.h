// MovieLensDataset: implicit-feedback training samples from MovieLens-1M files, for a BPR
// recommender.
//
// Files (in DataOptions::path):
//   movies.dat   MovieID::Title::Genres          (Genres '|'-separated)
//   ratings.dat  UserID::MovieID::Rating::Timestamp
// Every rating counts as an interaction, whatever its value. Blank lines are skipped; a trailing
// '\r' is dropped. A malformed line (wrong field count, a non-integer field, a rating of a movie
// movies.dat does not list, a MovieID listed twice) is a MovieLensError naming file:line and the
// problem.
//
// Ids: users are the UserIDs that rate something, movies every MovieID of movies.dat; each is
// remapped to a dense 0-based index in ascending order of its original id (user_ids() and
// movie_ids() map back).
//
// Leave-last-out split: each user's latest interaction (largest timestamp; among equal
// timestamps, the one later in ratings.dat) is held out for evaluation, the rest are training
// samples. A user with a single interaction has nothing left to train on if it is held out, so
// such users are kept for training only and have no held-out row.
//
// Samples: with n training interactions (in ratings.dat order) and K = negatives_per_interaction,
// there are K * n samples; sample i is interaction i mod n and reads as inputs (user, positive
// item, negative item). The negative is drawn uniformly from the items other than the positive by
// a counter-based hash of (seed, i): the same index always gives the same negative, whoever reads
// it, so every rank and world size sees the same samples. An epoch over the dataset thus sees each
// interaction K times, with K independently drawn negatives (one fixed negative per interaction
// lets BPR memorise the pairs: training loss near 0, HR@10 below a popularity baseline). The
// negative may be another item the user rated.
//
// Item text: the bytes of "Title | Genres" (UTF-8; movies.dat of ML-1M is ISO-8859-1, so a
// title that is not valid UTF-8 is converted from Latin-1), cut to text_len bytes and padded with
// core::kTextPadId. Immutable after construction; get() is safe to call from several threads.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/errors.h"

namespace data {

// A DataError (data/errors.h), so the launcher treats a malformed file as a user mistake (exit 2).
class MovieLensError : public DataError {
 public:
  using DataError::DataError;
};

class MovieLensDataset final : public Dataset {
 public:
  // Reads `dir`/movies.dat and `dir`/ratings.dat. Throws MovieLensError (a missing file, a bad
  // line, fewer than 2 movies) and std::invalid_argument (text_len < 1,
  // negatives_per_interaction < 1).
  MovieLensDataset(const std::string& dir, int64_t text_len, uint64_t seed,
                   int64_t negatives_per_interaction = 8);
  // The same from the data section: path, text_len, seed, negatives.
  explicit MovieLensDataset(const DataOptions& options);

  // negatives_per_interaction() * num_interactions().
  int64_t size() const override { return negatives_per_interaction_ * num_interactions(); }
  int64_t num_interactions() const { return train_users_.size(0); }
  int64_t negatives_per_interaction() const { return negatives_per_interaction_; }
  // input_dim 3 (user, positive, negative), users, items and their texts.
  core::Shape shape() const override;
  // inputs int64 [n, 3] (user, positive, negative); targets int64 zeros [n].
  // Throws std::out_of_range for an index outside [0, size()).
  Batch get(const at::Tensor& indices) const override;
  // The leave-last-out task: held_out() against every item, train_interactions() masked.
  std::optional<RankingTask> ranking_task() const override;

  int64_t num_users() const { return static_cast<int64_t>(user_ids_.size()); }
  int64_t num_items() const { return static_cast<int64_t>(movie_ids_.size()); }
  // int64 [num_items, text_len]: bytes of "Title | Genres", padded with core::kTextPadId.
  const at::Tensor& item_text() const { return item_text_; }
  // int64 [n_eval_users, 2] (user, item), one row per user with >= 2 interactions, by user.
  const at::Tensor& held_out() const { return held_out_; }
  // int64 [num_interactions(), 2] (user, item): every training interaction, in ratings.dat order
  // (sample i reads row i mod num_interactions()); to mask seen items when ranking held-out ones.
  at::Tensor train_interactions() const;
  // Dense index -> original id.
  const std::vector<int64_t>& user_ids() const { return user_ids_; }
  const std::vector<int64_t>& movie_ids() const { return movie_ids_; }
  // The negative item of sample `index` whose positive is `positive`.
  int64_t negative(int64_t index, int64_t positive) const;

 private:
  uint64_t seed_;
  int64_t negatives_per_interaction_;
  std::vector<int64_t> user_ids_;
  std::vector<int64_t> movie_ids_;
  at::Tensor train_users_;  // int64 [size()]
  at::Tensor train_items_;  // int64 [size()]
  at::Tensor held_out_;
  at::Tensor item_text_;
};

}  // namespace data
