// Sharded checkpoints: the manifest of a step directory and the layout it records (issue 25,
// item 4; docs/DESIGN.md "Checkpoints").
//
// A sharded checkpoint is one directory (step_dir_name(step)) holding one safetensors file per
// rank (shard_file_name(rank)) and manifest.json. Each rank writes only what it owns, with no
// gather; the manifest says where every element of every logical tensor lives, so a reader at
// any world size and any ddp.shard mode reads only the ranges it needs.
//
// Layout, described generically (no knowledge of buckets or modes): a logical tensor (for example
// "adamw.exp_avg.h.0.attn.weight", with its dtype and shape) is seen flat, in its element order:
// row-major, or, when the tensor has an `order` (a permutation of its dimensions), row-major over
// tensor.permute(order), the order memory holds a tensor of other strides in (a channels-last
// NCHW weight is [0, 2, 3, 1]: N, H, W, C), since a sharded mode's buckets hold a parameter by its
// strides and ranks write ranges of those buckets. A ShardPiece
// says that `count` of its elements, starting at element `offset`, are stored in the piece's file
// as the tensor `key`, starting at element `key_offset` of that (flat) tensor. A rank that owns
// (name, offset, count) ranges of a flat buffer records one piece per range. A mode that also
// shards the parameters only adds "param.*" pieces to what each rank writes; replicated state is
// written once (by rank 0) as whole-tensor pieces.
//
// Contract:
// - Pure functions, no collectives, no LibTorch: every rank may call them.
// - parse_manifest and check_layout throw ShardManifestError naming the manifest and the tensor
//   or file; a layout that misses or duplicates an element of a logical tensor is refused.
// - verify_shard_files throws ShardFileDamaged naming the file that is missing, has another size
//   or another CRC-32 than the manifest records (resume "auto" then takes an older checkpoint).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace io {

class ShardManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A shard file that is missing or does not verify.
class ShardFileDamaged : public ShardManifestError {
 public:
  using ShardManifestError::ShardManifestError;
};

inline constexpr const char* kShardManifestName = "manifest.json";
// v2 adds LogicalTensor::order; a manifest with no order is written as v1 (older readers take it,
// and refuse a v2 one rather than read its ranges row-major). Both are read.
inline constexpr const char* kShardManifestFormat = "trainer-sharded-checkpoint-v1";
inline constexpr const char* kShardManifestFormatV2 = "trainer-sharded-checkpoint-v2";

struct LogicalTensor {
  std::string dtype;           // safetensors dtype name: "F32", "BF16", ...
  std::vector<int64_t> shape;  // the tensor's shape; elements = product
  // The element order (above): empty for row-major, else a permutation of the dimensions.
  std::vector<int64_t> order = {};
  int64_t numel() const;
};

// The element order of a dense tensor of these sizes and strides, as LogicalTensor::order: the
// dimensions by decreasing stride (those of size 1, which do not change the order, first), or
// empty when that is row-major. Canonical: two tensors hold their elements in the same order
// exactly when their element_order is equal. Throws std::invalid_argument when the strides do
// not describe a dense tensor (overlapping or with gaps).
std::vector<int64_t> element_order(const std::vector<int64_t>& sizes,
                                   const std::vector<int64_t>& strides);

struct ShardPiece {
  std::string name;  // the logical tensor
  int64_t offset = 0;
  int64_t count = 0;
  std::string key;  // the tensor in the shard file
  int64_t key_offset = 0;
};

struct ShardFile {
  std::string file;  // relative to the step directory
  int rank = 0;
  int64_t bytes = 0;  // the file's size
  std::string crc32;  // "crc32:xxxxxxxx" of the whole file
  std::vector<ShardPiece> pieces;
};

struct ShardManifest {
  int world_size = 0;
  std::string shard_mode;  // ddp.shard of the run that wrote it
  int64_t step = 0;
  int64_t global_batch_size = 0;
  uint64_t seed = 0;
  std::string config;  // the run's effective configuration (YAML); may be empty
  std::map<std::string, LogicalTensor> tensors;
  std::vector<ShardFile> files;
  // The learning-rate schedule's plan (train/schedule.h), as text; empty in older manifests.
  std::string schedule{};
  // LoRA: the frozen base's path and hash (checkpoint::CheckpointMeta); empty otherwise.
  std::string base{};
  std::string base_hash{};

  // A LoRA run's checkpoint: the adapters alone, over the frozen base base_hash names.
  bool adapters_only() const { return !base_hash.empty(); }
};

// "step_000100", "rank_00003.safetensors".
std::string step_dir_name(int64_t step);
std::string shard_file_name(int rank);

std::string manifest_to_json(const ShardManifest& manifest);
// `source` names the manifest in messages. Checks the layout too (check_layout).
ShardManifest parse_manifest(const std::string& text, const std::string& source);
ShardManifest read_manifest(const std::string& step_dir);

// Every element of every logical tensor is in exactly one piece, every piece names a known
// tensor and lies inside it, and every order is a permutation of its tensor's dimensions.
void check_layout(const ShardManifest& manifest, const std::string& source);

// The pieces holding elements [offset, offset + count) of `name`, clipped to that range and in
// element order (a reader's plan: what to read from which file). Throws ShardManifestError when
// the tensor is unknown or the range is outside it.
struct PieceRead {
  std::string file;
  ShardPiece piece;  // clipped
};
std::vector<PieceRead> pieces_for(const ShardManifest& manifest, const std::string& name,
                                  int64_t offset, int64_t count);

// "crc32:xxxxxxxx" of a file's bytes (streamed). Throws ShardFileDamaged when it cannot be read.
std::string file_crc32(const std::string& path);

// Checks that each of the manifest's files exists in `step_dir` with its size and CRC-32.
void verify_shard_files(const std::string& step_dir, const ShardManifest& manifest);

}  // namespace io
