// TokenShardDataset: windows of tokens from uint16 or uint32 .bin shards, memory-mapped.
//
// Formats: nanoGPT's flat little-endian uint16 tokens, and llm.c's, which puts a header of 256
// int32 in front (token count at [2]): magic 20240520 version 1 for uint16 tokens (GPT-2's),
// magic 20240801 version 7 for uint32 tokens (Llama 3's). A file is llm.c's when its first four
// bytes are a magic (a flat shard would have to start with the token pair 41720, 308 or 55713,
// 308); a flat file is uint16. Validated on open: an empty file, an odd byte count, a header with
// another version or a token count that disagrees with the file's size, and a token id at or
// above vocab_size (Note [Token ids checked at open] in token_shard.cpp: one vectorised pass per
// file) are DataErrors naming the file (and byte offset), and so is a split in which no shard
// holds one window (context + 1 tokens).
//
// Sample i is the i-th window of context + 1 tokens, shards in the order given (find_shards: name
// order), window k of a shard starting at token k * context; windows never cross shards, so a
// shard of N tokens holds (N - 1) / context of them (a shard shorter than a window holds none).
// inputs = its first `context` tokens, targets = its last `context`, both int64 [n, context].
// Nothing is read past a file's end.
//
// Beside a shard NAME.bin (or any other name: NAME.bin.mask), scripts/tokenize_text.py --chat
// writes two files that this dataset reads when they are there (docs/reference.md, "Chat data"),
// each a 32-byte header (8 bytes of magic, uint32 version 1, uint32 0, uint64 count, uint64 0)
// and then:
//   NAME.mask  magic TRAINMSK: count = the shard's tokens, one byte each, 1 where the token is a
//              target the loss counts (the assistant's), 0 where it is not
//   NAME.docs  magic TRAINDOC: count = its documents, then count + 1 uint64 token offsets, from 0
//              up to the shard's token count, strictly increasing: document d is tokens
//              [offsets[d], offsets[d + 1])
// Checked on open: the headers, a count that disagrees with the shard or with the file's size, a
// mask byte other than 0 or 1, a boundary that is not above the one before or lies past the
// shard's end; and every shard of a split has a mask (and boundaries) or none has. Each is a
// DataError naming the file and byte offset.
//
// With a mask, a target whose token's mask is 0 is core::kIgnoreTarget. Packing (Packing, from
// data.packing; auto: documents when the shards carry boundaries, else none):
//   none       the windows above.
//   documents  each sample is a window of `context` positions holding whole documents, packed
//              by pack_best_fit (data/token_packing.h; a document longer than the context is
//              split first, split_documents). A document of L tokens fills L positions: position
//              i's input is its token i, its target its token i + 1 where that token's mask is 1,
//              else core::kIgnoreTarget, its last position's target always that; positions
//              (Batch::positions) count from 0 at each document. The rest of the window is
//              padding: input 0 (kPadInput), target ignored, positions 0, 1, ... as if one more
//              document, so every position attends at least itself.
// target_count(indices) sums a per-window count built at open; packing() reports the windows'
// efficiency.
//
// Preference pairs (NAME.pairs beside every shard, scripts/tokenize_text.py --preference: a
// 32-byte header, magic TRAINPAR, count the shard's pairs; documents 2p and 2p + 1 are pair p's
// chosen and rejected sequences): read only for a preference objective (`preference`), and then
// sample i is pair i, whole: inputs and targets int64 [n, 2, context], [k, 0] the chosen
// sequence and [k, 1] the rejected one, each in its own row from position 0 (its tokens' targets
// by the mask, as above), padded after its end (input kPadInput, target ignored; causal attention
// keeps the padding out of the sequence's positions), so a pair is never split or packed with
// another; Batch::pairs holds the indices. A sequence longer than context + 1 tokens is a
// DataError naming the shard and pair. target_count is one per pair (a preference loss is a
// mean over pairs), packing() nullopt.
//
// Immutable after construction; get() may run on several threads at once. The mappings live as
// long as the dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_packing.h"

namespace data {

class TokenShard;  // one shard on disk and its sidecars (token_shard.h)

// The input id of a packed window's padding positions (any id below the vocabulary would do: their
// targets are ignored and they attend only each other).
inline constexpr int64_t kPadInput = 0;

class TokenShardDataset final : public Dataset {
 public:
  // `files`: the shards, in order; `validation_files`: the held-out split (may be empty), read
  // with the packing the training split resolves to. `preference`: the preference objective
  // (train.objective: "dpo", "simpo") that reads the shards' pairs, or "" (lm): the shards must
  // carry NAME.pairs exactly when it is given. Throws DataError.
  TokenShardDataset(const std::vector<std::string>& files, int64_t context, int64_t vocab_size,
                    const std::vector<std::string>& validation_files = {},
                    Packing packing = Packing::kAuto, const std::string& preference = "");
  ~TokenShardDataset() override;
  TokenShardDataset(const TokenShardDataset&) = delete;
  TokenShardDataset& operator=(const TokenShardDataset&) = delete;

  int64_t size() const override { return windows_; }
  core::Shape shape() const override;
  Batch get(const at::Tensor& indices) const override;
  int64_t target_count(const at::Tensor& indices) const override;
  std::optional<PackingStats> packing() const override;
  std::shared_ptr<const Dataset> validation() const override { return validation_; }

  int64_t tokens() const { return tokens_; }  // in all shards, windowed or not
  // Bytes per token id of the widest shard: 2 (uint16) or 4 (uint32, llm.c's Llama 3 header).
  int64_t token_width() const;
  const std::vector<std::string>& files() const { return files_; }
  Packing packing_mode() const { return packing_; }  // documents or none

 private:
  void open_shards(const std::vector<std::string>& files);
  void resolve_packing(Packing requested);
  void window_unpacked();
  void window_documents();
  void fill_unpacked(int64_t i, int64_t* inputs, int64_t* targets) const;
  void fill_packed(int64_t i, int64_t* inputs, int64_t* targets, int64_t* positions) const;
  void check_index(int64_t i) const;
  // Preference pairs (NAME.pairs): present exactly when `preference` names an objective.
  void check_pairs(const std::string& preference) const;
  void window_pairs();
  void fill_sequence(const Piece& piece, int64_t* inputs, int64_t* targets) const;
  Batch get_pairs(const at::Tensor& indices) const;

  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<int64_t> first_window_;    // unpacked: per shard, the index of its first window
  PackedWindows packed_;                 // documents: each window's pieces
  std::vector<int32_t> window_targets_;  // per window; empty: `context` in every window
  std::vector<std::string> files_;
  int64_t context_;
  int64_t vocab_size_;
  Packing packing_ = Packing::kNone;
  bool masks_ = false;            // the shards carry loss masks
  bool documents_ = false;        // ... and document boundaries
  bool pairs_ = false;            // ... and preference pairs: a sample is a pair
  std::vector<Piece> sequences_;  // pairs: sequence 2p is pair p's chosen, 2p + 1 its rejected
  int64_t windows_ = 0;
  int64_t tokens_ = 0;
  PackingStats stats_;
  std::shared_ptr<const Dataset> validation_;
};

// The shards data.path and data.val_path name. data.path: a .bin file (training; no validation
// unless data.val_path), or a directory whose *.bin files without "val" in the name train and
// those with it validate, each list sorted by name. data.val_path (a file or a directory of .bin
// files), when set, replaces the validation list. Throws DataError for a directory with no shards.
struct ShardFiles {
  std::vector<std::string> train;
  std::vector<std::string> validation;
};
ShardFiles find_shards(const std::string& path, const std::string& val_path);

}  // namespace data
