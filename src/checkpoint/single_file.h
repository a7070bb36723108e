// The single-file checkpoint format (checkpoint.format: single): everything needed to resume a
// run in one safetensors file, readable from Python with safetensors.torch.load_file.
//
// Contents: "param.<name>" for every parameter, "buffer.<name>" for every buffer except embedding
// caches (rebuilt on resume) and a LoRA run's frozen base (models::FrozenBase: loaded from
// model.init_from on resume, named by the metadata "base" and "base_hash"), "adamw.exp_avg.<name>"
// and "adamw.exp_avg_sq.<name>" for AdamW's moments ("muon.momentum.<name>" alone for a matrix Muon
// updates), and string metadata: the format (kSingleFileFormat), the optimizer steps completed
// ("step"), the global batch size, seed and world size the run had, the run's configuration
// (YAML) when known, and a CRC-32 of every tensor's name and bytes in name order ("checksum":
// "crc32:xxxxxxxx").
//
// Writing goes to a temporary file next to `path`, fsync'd, renamed into place, and the directory
// fsync'd, so a job killed while writing leaves the previous checkpoint whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "io/safetensors.h"
#include "models/model.h"

namespace checkpoint {

// The model's tensors in a checkpoint, under their keys: "param.<name>" first (the likeliest to
// differ and the clearest to report), then "buffer.<name>" for every buffer but the caches
// (build_cache() rebuilds those) and a frozen base's (models::FrozenBase).
std::vector<std::pair<std::string, at::Tensor>> model_entries(models::Model& model);

// What a single-file checkpoint holds under its keys: the model's entries (model_entries) and
// the optimizer's moments (one pair per parameter, in named_parameters() order; a matrix whose
// `muon` flag is set: its momentum alone, first_moment_key). Views, not copies.
std::map<std::string, at::Tensor> checkpoint_tensors(models::Model& model,
                                                     const std::vector<at::Tensor>& exp_avgs,
                                                     const std::vector<at::Tensor>& exp_avg_sqs,
                                                     const std::vector<bool>& muon = {});

// Writes the model (parameters, non-cache buffers), AdamW's moments (one pair per parameter, in
// named_parameters() order) and `meta`. Throws CheckpointError.
void write_checkpoint(const std::string& path, models::Model& model,
                      const std::vector<at::Tensor>& exp_avgs,
                      const std::vector<at::Tensor>& exp_avg_sqs, const CheckpointMeta& meta);

// The same file from the tensors under their keys (as read_checkpoint gives them).
void write_checkpoint_tensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const CheckpointMeta& meta);

// The same file from tensors made one at a time (--consolidate, streamed): `entries` lists each
// key's dtype and shape, `produce` gives its tensor when its turn comes (key order), and the
// checksum is computed as they are written and filled into the header last, so that one tensor
// at a time is held. Throws CheckpointError.
void write_checkpoint_streaming(const std::string& path, std::vector<io::TensorEntry> entries,
                                const std::function<at::Tensor(const io::TensorEntry&)>& produce,
                                const CheckpointMeta& meta);

// Reads and verifies a single file (its checksum, when it has one). Throws CheckpointDamaged (a
// damaged, truncated or empty file) or CheckpointError (missing, another format).
Checkpoint read_single_file(const std::string& path);

// zlib's CRC-32 of every tensor's name and contiguous CPU bytes, in name order, as
// "crc32:xxxxxxxx".
std::string tensor_checksum(const std::map<std::string, at::Tensor>& tensors);

}  // namespace checkpoint
