// TokenShardDataset: windows of tokens from uint16 or uint32 .bin shards, memory-mapped.
//
// Formats: nanoGPT's flat little-endian uint16 tokens, and llm.c's, which puts a header of 256
// int32 in front (token count at [2]): magic 20240520 version 1 for uint16 tokens (GPT-2's),
// magic 20240801 version 7 for uint32 tokens (Llama 3's). A file is llm.c's when its first four
// bytes are a magic (a flat shard would have to start with the token pair 41720, 308 or 55713,
// 308); a flat file is uint16. Validated on open: an empty file, an odd byte count, a header with
// another version or a token count that disagrees with the file's size, and a token id at or
// above vocab_size (Note [Token ids checked at open] in token_shards.cpp: one vectorised pass per
// file) are DataErrors naming the file (and byte offset), and so is a split in which no shard
// holds one window (context + 1 tokens).
//
// Sample i is the i-th window of context + 1 tokens, shards in the order given (find_shards: name
// order), window k of a shard starting at token k * context; windows never cross shards, so a
// shard of N tokens holds (N - 1) / context of them (a shard shorter than a window holds none).
// inputs = its first `context` tokens, targets = its last `context`, both int64 [n, context].
// Nothing is read past a file's end.
//
// Immutable after construction; get() may run on several threads at once. The mappings live as
// long as the dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace data {

class TokenShardDataset final : public Dataset {
 public:
  // `files`: the shards, in order; `validation_files`: the held-out split (may be empty).
  // Throws DataError.
  TokenShardDataset(const std::vector<std::string>& files, int64_t context, int64_t vocab_size,
                    const std::vector<std::string>& validation_files = {});
  ~TokenShardDataset() override;
  TokenShardDataset(const TokenShardDataset&) = delete;
  TokenShardDataset& operator=(const TokenShardDataset&) = delete;

  int64_t size() const override { return windows_; }
  core::Shape shape() const override;
  Batch get(const at::Tensor& indices) const override;
  std::shared_ptr<const Dataset> validation() const override { return validation_; }

  int64_t tokens() const { return tokens_; }  // in all shards, windowed or not
  const std::vector<std::string>& files() const { return files_; }

 private:
  struct Shard;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<int64_t> first_window_;  // per shard: the index of its first window
  std::vector<std::string> files_;
  int64_t context_;
  int64_t vocab_size_;
  int64_t windows_ = 0;
  int64_t tokens_ = 0;
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
