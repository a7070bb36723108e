// Trainer::save_checkpoint: the single-file format (rank 0 gathers and writes) and the sharded one
// (every rank writes its shard; train/checkpoint_sharded.h). docs/DESIGN.md, "Checkpoints".
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "ddp/gather.h"
#include "ddp/options.h"
#include "train/checkpoint.h"
#include "train/checkpoint_sharded.h"
#include "train/error_text.h"
#include "train/trainer.h"

namespace train {
namespace {

constexpr const char* kSuffix = ".safetensors";

using Clock = std::chrono::steady_clock;
using seconds = std::chrono::duration<double>;
double seconds_since(Clock::time_point t) { return seconds(Clock::now() - t).count(); }

std::string without_suffix(const std::string& path) {
  const std::string suffix = kSuffix;
  if (path.size() > suffix.size() && path.ends_with(suffix)) {
    return path.substr(0, path.size() - suffix.size());
  }
  return path;
}

// "ok BYTES CRC" or "error WHY": a rank's vote on its shard file.
std::string vote_of(const io::ShardFile& file) {
  return fmt::format("ok {} {}", file.bytes, file.crc32);
}

// Test-only (tests/e2e/e2e.sh, sharded_checkpoint_killed_mid_write_np2):
// TRAINER_TEST_SHARD_WRITE_PAUSE=R:S makes rank R sleep after writing its shard of step S, before
// the vote, so that the test can kill it in the middle of a sharded write.
void pause_if_asked(int rank, int64_t step) {
  const char* value = std::getenv("TRAINER_TEST_SHARD_WRITE_PAUSE");
  int r = -1;
  long long s = -1;
  if (value != nullptr && std::sscanf(value, "%d:%lld", &r, &s) == 2 && r == rank && s == step) {
    spdlog::warn("TRAINER_TEST_SHARD_WRITE_PAUSE: rank {} pauses in the write of step {}", r, s);
    std::this_thread::sleep_for(std::chrono::seconds(600));
  }
}

}  // namespace

bool Trainer::sharded_checkpoints() const {
  const std::string& format = options_.checkpoint.format;
  // auto: by ddp.shard as configured, so that a run a fallback rung shards keeps its format.
  // Hybrid sharding (every node holds the same blocks) writes the single file: the shard files'
  // layout assumes that the world's ranks hold disjoint blocks (config: sharded is refused there).
  return format == "sharded" || (format == "auto" && options_.ddp.shard != ddp::ShardMode::kNone &&
                                 options_.ddp.shard_group == ddp::ShardGroup::kWorld);
}

std::string Trainer::save_checkpoint(const std::string& path, int64_t steps_done) {
  const std::string written = sharded_checkpoints() ? without_suffix(path) : path;
  if (sharded_checkpoints()) {
    save_sharded_checkpoint(written, steps_done);
  } else {
    // Sharded: the moments are gathered into full tensors on rank 0 (collective), so the file
    // is the one an unsharded run writes and resumes on any world size, sharded or not.
    const auto started = Clock::now();
    std::vector<at::Tensor> exp_avgs, exp_avg_sqs;
    const auto pinned = pin_parameters();  // parameters: the whole model, on every rank
    if (reducer_->sharded()) {
      exp_avgs = reducer_->unshard(optimizer_->exp_avgs(), 0);
      exp_avg_sqs = reducer_->unshard(optimizer_->exp_avg_sqs(), 0);
    }
    if (control_.rank() != 0) return written;
    write_checkpoint(path, *model_, reducer_->sharded() ? exp_avgs : optimizer_->exp_avgs(),
                     reducer_->sharded() ? exp_avg_sqs : optimizer_->exp_avg_sqs(),
                     {steps_done, options_.train.global_batch_size, options_.train.seed,
                      control_.size(), options_.config_text});
    spdlog::info("checkpoint written: {} ({} steps done), the step waited {:.3f} s", path,
                 steps_done, seconds_since(started));
  }
  if (control_.rank() != 0) return written;
  // Older periodic checkpoints go only once the new one is complete (renamed into place).
  for (const auto& old :
       prune_checkpoints(options_.checkpoint.dir, options_.checkpoint.keep_last)) {
    spdlog::info("checkpoint.keep_last = {}: deleted {}", options_.checkpoint.keep_last, old);
  }
  return written;
}

void Trainer::save_sharded_checkpoint(const std::string& step_dir, int64_t steps_done) {
  ShardedState state;
  for (const auto& item : model_->named_parameters())
    state.params.emplace_back(item.key(), item.value());
  for (const auto& [key, t] : model_entries(*model_)) {
    if (key.starts_with("buffer.")) state.buffers.emplace_back(key, t);
  }
  if (reducer_->sharded()) {
    state.layout = &reducer_->layout();
    state.param_blocks = reducer_->parameter_shards();
  }
  state.exp_avgs = optimizer_->exp_avgs();
  state.exp_avg_sqs = optimizer_->exp_avg_sqs();
  const int world = control_.size();
  const int rank = control_.rank();
  const auto started = Clock::now();
  auto copied = started, written = started;
  // The copy to host memory, then the file: a rank's failure is voted, so every rank agrees.
  std::string vote;
  try {
    std::map<std::string, at::Tensor> host;
    for (const auto& [key, t] : shard_content(state, world, rank, true).tensors) {
      host[key] = t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
    copied = Clock::now();
    vote = vote_of(write_shard_file(step_dir + ".tmp", rank, host));
    written = Clock::now();
    pause_if_asked(rank, steps_done);
  } catch (const std::exception& e) {
    vote = "error " + first_line(e.what());
  }
  const auto votes = ddp::all_gather_strings(control_, vote);  // the one collective
  io::ShardManifest manifest{
      world,
      std::string(ddp::kShardModeNames[static_cast<size_t>(reducer_->shard_mode())]),
      steps_done,
      options_.train.global_batch_size,
      options_.train.seed,
      options_.config_text,
      logical_tensors(state),
      {}};
  for (int r = 0; r < world; ++r) {
    io::ShardFile file{io::shard_file_name(r), r, 0, "",
                       shard_content(state, world, r, false).pieces};
    char crc[64] = {};
    long long bytes = 0;
    if (std::sscanf(votes[r].c_str(), "ok %lld %63s", &bytes, crc) != 2) {
      throw CheckpointError(fmt::format("checkpoint {}: rank {} could not write its shard: {}",
                                        step_dir, r, votes[r]));
    }
    file.bytes = bytes;
    file.crc32 = crc;
    manifest.files.push_back(std::move(file));
  }
  if (rank != 0) return;
  commit_sharded_checkpoint(step_dir, manifest);
  // bench/checkpoint_stall.sh reads the times (rank 0's).
  spdlog::info(
      "checkpoint written: {} ({} steps done), {} shard files, the step waited {:.3f} s: host "
      "copy {:.3f} s, file and fsync {:.3f} s, vote and manifest {:.3f} s",
      step_dir, steps_done, world, seconds_since(started), seconds(copied - started).count(),
      seconds(written - copied).count(), seconds_since(written));
}

}  // namespace train
