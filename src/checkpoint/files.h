// The files of a checkpoint directory (checkpoint.dir): which checkpoints it holds and in which
// order, pruning (checkpoint.keep_last), what interrupted writes left, and the file-system
// operations every writer uses (fsync, rename). docs/DESIGN.md, "Checkpoints".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace checkpoint {

// Creates `dir` if needed and checks that a file can be written there, so that a typo in
// checkpoint.dir stops the job at start-up instead of at its first checkpoint, hours later.
// Throws CheckpointError naming the key and the directory.
void check_checkpoint_dir(const std::string& dir);

// The single-file checkpoint in `dir` with the most steps completed (read from each
// *.safetensors file's metadata; files that are not checkpoints are ignored); "" when there is
// none.
std::string latest_checkpoint(const std::string& dir);

// Every checkpoint in `dir` (files and step directories), the most steps first (ties: by name);
// those whose header cannot be read come first (they cannot be ordered, and reading them says at
// once how they are damaged).
std::vector<std::string> checkpoints_newest_first(const std::string& dir);

// checkpoint.keep_last: deletes periodic checkpoints (step_N.safetensors, complete step_N
// directories) of `dir` other than the `keep` with the most steps; final and out-of-memory
// checkpoints stay. keep <= 0: none deleted. Returns the deleted paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep);

// What interrupted writes left in `dir`: checkpoint names (step_N, final, oom_step_N, as files or
// step directories) with ".tmp" appended, except `keep` (the one being committed). Removes them
// (a directory one level deep) and returns the removed paths. Rank 0, while no other write is in
// flight.
std::vector<std::string> remove_unfinished_writes(const std::string& dir, const std::string& keep);

// Whether `path` is a directory holding a manifest (a sharded checkpoint).
bool is_sharded_checkpoint(const std::string& path);

// Removes a step directory and its files (not recursive beyond one level), the manifest first.
// Returns success.
bool remove_step_dir(const std::string& step_dir);

// The directory `path` is in: "." for a bare name.
std::string parent_dir(const std::string& path);

// fsync of a file or (`directory`) a directory. Throws CheckpointError naming it.
void fsync_path(const std::string& path, bool directory);

// rename(2), or CheckpointError naming both paths.
void rename_or_throw(const std::string& from, const std::string& to);

// The names in `dir` (not "." or ".."); empty when it cannot be read.
std::vector<std::string> files_in(const std::string& dir);

}  // namespace checkpoint
