// Sharded safetensors checkpoints, the layout of Hugging Face's save_pretrained: above the
// maximum shard size, the tensors go to model-00001-of-0000N.safetensors ... and
// model.safetensors.index.json maps each tensor's name to its file:
//   {"metadata": {"total_size": BYTES}, "weight_map": {"name": "model-00001-of-00002.safetensors"}}
// Below it, one model.safetensors and no index.
//
// Contract: every problem a user can cause (a missing shard, an index that is not JSON or names
// a tensor its shard does not hold, a tensor in two shards) is a SafetensorsError naming the
// file. The tensors come back as read_safetensors gives them (CPU, owning their memory).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace io {

inline constexpr const char* kSafetensorsFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";

// A size as save_pretrained's max_shard_size spells it: bytes ("1000"), or a number with a unit,
// decimal (KB, MB, GB: 10^3, 10^6, 10^9) or binary (KiB, MiB, GiB). Throws std::invalid_argument
// naming the text otherwise.
int64_t parse_shard_size(const std::string& text);

// The files of a checkpoint directory: {dir/model.safetensors} or, where the index is, the
// shard files it names (in order). Empty when the directory holds neither.
std::vector<std::string> safetensors_files(const std::string& dir);

// Every tensor of `dir`'s model.safetensors, or of the shards its index names (each shard's
// tensors checked against the index). Throws SafetensorsError.
std::map<std::string, at::Tensor> read_safetensors_dir(const std::string& dir);

// Writes `tensors` into `dir` as save_pretrained does: one model.safetensors when their bytes
// fit in `max_shard_bytes`, else shards of at most that many bytes (a larger tensor alone in its
// own) in name order, and the index. Removes the files of the other layout that an earlier
// export left there. Each file gets `metadata`. Returns the files written (the index last).
std::vector<std::string> write_safetensors_dir(const std::string& dir,
                                               const std::map<std::string, at::Tensor>& tensors,
                                               int64_t max_shard_bytes,
                                               const std::map<std::string, std::string>& metadata);
// The same for tensors made one at a time (an export streamed unit by unit): `entries` says each
// one's name, dtype and shape, and `produce` gives its tensor when its turn comes (name order),
// so that at most one tensor and one file's header are held. Returns what the other does.
std::vector<std::string> write_safetensors_dir(
    const std::string& dir, std::vector<TensorEntry> entries,
    const std::function<at::Tensor(const TensorEntry&)>& produce, int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata);

}  // namespace io
