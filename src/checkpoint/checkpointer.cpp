// Checkpointer's writing half: save (the host copy, then the write of this rank's file, in the
// background under checkpoint.async) and finish (the vote and rank 0's commit). The resuming half
// is in checkpointer_resume.cpp.
#include "checkpoint/checkpointer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include "checkpoint/files.h"
#include "checkpoint/pending.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "core/error_text.h"
#include "ddp/gather.h"

namespace checkpoint {

using Clock = std::chrono::steady_clock;
using seconds = std::chrono::duration<double>;

namespace {

constexpr const char* kSuffix = ".safetensors";

double seconds_since(Clock::time_point t) { return seconds(Clock::now() - t).count(); }

std::string without_suffix(const std::string& path) {
  const std::string suffix = kSuffix;
  if (path.size() > suffix.size() && path.ends_with(suffix)) {
    return path.substr(0, path.size() - suffix.size());
  }
  return path;
}

// A rank's vote: "ok BYTES CRC FILE" (FILE: the index of the file it wrote), "nothing" (it writes
// no file), or a failure: "full WHY" (the file system is out of space: checkpoint::out_of_space),
// "disk WHY" (another failed system call of the write) or "error WHY" (anything else).
constexpr const char* kNothing = "nothing";
// Rank 0's vote on a single file: an "ok" vote whose size, CRC and index nobody reads (the file
// renamed itself into place; there is no manifest to fill).
constexpr const char* kSingleFileWritten = "ok 0 - 0";
std::string vote_of(const io::ShardFile& file, int index) {
  return fmt::format("ok {} {} {}", file.bytes, file.crc32, index);
}

// Test-only (tests/e2e/e2e.sh): TRAINER_TEST_SHARD_WRITE_PAUSE=R:S[:FILE] makes rank R's write of
// step S's shard pause after its file is written, before the vote (a single file: rank 0's, before
// its last tensor, the temporary file half written): until FILE exists when given (at most
// 600 s), else for 600 s, so that a test can kill the rank in the middle of the write or check
// that training goes on while the write waits.
void pause_if_asked(int rank, int64_t step) {
  const char* value = std::getenv("TRAINER_TEST_SHARD_WRITE_PAUSE");
  int r = -1;
  long long s = -1;
  char release[4096] = {};
  const int n = value == nullptr ? 0 : std::sscanf(value, "%d:%lld:%4095s", &r, &s, release);
  if (n < 2 || r != rank || s != step) return;
  spdlog::warn("TRAINER_TEST_SHARD_WRITE_PAUSE: rank {} pauses in the write of step {}", r, s);
  for (int tenths = 0; tenths < 6000; ++tenths) {
    std::error_code ec;
    if (n == 3 && std::filesystem::exists(release, ec)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Runs `job` (which returns this rank's vote) on a background thread when `background`, else now;
// an exception becomes an "error" vote, so that every rank learns of it at the vote.
template <class Job>
std::future<WriteOutcome> launch_write(bool background, Job job) {
  auto run = [job = std::move(job)]() -> WriteOutcome {
    const auto started = Clock::now();
    WriteOutcome out;
    try {
      out.vote = job();
    } catch (const CheckpointError& e) {
      const char* kind = out_of_space(e.error_number()) ? "full"
                         : e.error_number() != 0        ? "disk"
                                                        : "error";
      out.vote = fmt::format("{} {}", kind, core::first_line(e.what()));
    } catch (const std::exception& e) {
      out.vote = "error " + core::first_line(e.what());
    }
    out.seconds = seconds_since(started);
    return out;
  };
  if (background) return std::async(std::launch::async, std::move(run));
  std::promise<WriteOutcome> done;
  done.set_value(run());
  return done.get_future();
}

// Copies of `tensors` in host memory that the step's later updates do not touch, into `host`;
// a failure (host memory) is returned, not thrown: the rank votes it, so every rank agrees.
std::string copy_to_host(const std::map<std::string, at::Tensor>& tensors,
                         std::map<std::string, at::Tensor>& host) {
  try {
    for (const auto& [key, t] : tensors) {
      host[key] = t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

WriteFailure::Kind kind_of(const std::string& vote) {
  if (vote.starts_with("full ")) return WriteFailure::kFull;
  if (vote.starts_with("disk ")) return WriteFailure::kDisk;
  return vote.starts_with("error ") ? WriteFailure::kOther : WriteFailure::kNone;
}

void note_failure(WriteFailure& worst, const std::string& vote, const std::string& who) {
  const auto kind = kind_of(vote);
  if (kind <= worst.kind) return;
  worst.kind = kind;
  worst.message = fmt::format("{}: {}", who, vote.substr(vote.find(' ') + 1));
}

// Rank r's vote on its file, into the pending checkpoint's manifest (sharded); a failure goes to
// `worst`.
void take_vote(PendingCheckpoint& p, int r, const std::string& vote, std::vector<int>& votes_of,
               WriteFailure& worst) {
  if (vote == kNothing) return;
  char crc[64] = {};
  long long bytes = 0;
  int index = -1;
  if (std::sscanf(vote.c_str(), "ok %lld %63s %d", &bytes, crc, &index) != 3) {
    note_failure(worst, vote,
                 fmt::format("rank {} could not write its {}", r, p.sharded ? "shard" : "file"));
    return;
  }
  if (!p.sharded) return;
  if (index < 0 || index >= static_cast<int>(p.manifest.files.size())) {
    throw std::logic_error(
        fmt::format("rank {} voted for file {} of {}", r, index, p.manifest.files.size()));
  }
  p.manifest.files[index].bytes = bytes;
  p.manifest.files[index].crc32 = crc;
  ++votes_of[index];
}

}  // namespace

bool Checkpointer::sharded() const {
  // auto: by ddp.shard as configured, so that a run a fallback rung shards keeps its format.
  return options_.format == Format::kSharded ||
         (options_.format == Format::kAuto && record_.configured_shard != ddp::ShardMode::kNone);
}

Checkpointer::Checkpointer(CheckpointOptions options, RunRecord record, CheckpointComms comms)
    : options_(std::move(options)), record_(std::move(record)), comms_(comms) {}

// A write still pending: waited for (PendingCheckpoint's future), never committed.
Checkpointer::~Checkpointer() = default;

std::string Checkpointer::path_of(const std::string& name) const {
  return fmt::format("{}/{}{}", options_.dir, name, kSuffix);
}

CheckpointMeta Checkpointer::meta(int64_t steps_done, const RunState& state) const {
  return {steps_done,          record_.global_batch_size,
          record_.seed,        comms_.control.size(),
          record_.config_text, state.schedule,
          record_.base,        record_.base_hash};
}

std::string Checkpointer::save(const std::string& path, int64_t steps_done, const RunState& state,
                               Need need) {
  finish();  // one write at a time
  const bool is_sharded = sharded();
  const std::string written = is_sharded ? without_suffix(path) : path;
  pending_ = is_sharded ? start_sharded(written, steps_done, state)
                        : start_single(written, steps_done, state);
  pending_->may_fail = need == Need::kMayFail;
  if (!options_.async) {
    finish();
  } else if (comms_.control.rank() == 0) {
    spdlog::info("checkpoint {} ({} steps done): the step waited {:.3f} s for the copy to host "
                 "memory; the files are written in the background",
                 written, steps_done, pending_->host_copy_s);
  }
  return written;
}

std::unique_ptr<PendingCheckpoint> Checkpointer::start_single(const std::string& path,
                                                              int64_t steps_done,
                                                              const RunState& state) {
  auto p = std::make_unique<PendingCheckpoint>();
  p->path = path;
  p->tmp = path + ".tmp";
  p->steps_done = steps_done;
  const auto started = Clock::now();
  // Sharded: the moments are gathered into full tensors on rank 0 (collective), so the file is
  // the one an unsharded run writes and resumes on any world size, sharded or not.
  const bool sharded_state = state.reducer->sharded();
  std::vector<at::Tensor> exp_avgs = state.exp_avgs, exp_avg_sqs = state.exp_avg_sqs;
  // ddp.shard: parameters: the whole model, on every rank.
  const auto gathered = state.gather_units ? state.gather_units() : nullptr;
  if (sharded_state) {
    exp_avgs = state.reducer->unshard(state.exp_avgs, 0);
    exp_avg_sqs = state.reducer->unshard(state.exp_avg_sqs, 0);
  }
  if (comms_.control.rank() != 0) {  // rank 0 writes alone; the others write nothing
    p->write = launch_write(false, [] { return std::string(kNothing); });
    return p;
  }
  std::map<std::string, at::Tensor> host;
  const std::string failed =
      copy_to_host(checkpoint_tensors(*state.model, exp_avgs, exp_avg_sqs, state.muon), host);
  p->host_copy_s = seconds_since(started);
  p->write = launch_write(options_.async, [host = std::move(host), path,
                                           meta = meta(steps_done, state), failed, steps_done] {
    if (!failed.empty()) throw CheckpointError(failed);
    std::vector<io::TensorEntry> entries;
    for (const auto& [key, t] : host) entries.push_back({key, t.scalar_type(), t.sizes().vec()});
    size_t produced = 0;
    write_checkpoint_streaming(
        path, std::move(entries),
        [&](const io::TensorEntry& e) {
          if (++produced == host.size()) pause_if_asked(0, steps_done);  // all but this written
          return host.at(e.name);
        },
        meta);
    return std::string(kSingleFileWritten);
  });
  return p;
}

namespace {

// What a sharded checkpoint of `state` holds: the parameters (or this rank's master blocks of
// them), the buffers and the optimizer's moments.
ShardedState sharded_state_of(const RunState& state) {
  ShardedState shards;
  for (const auto& item : state.model->named_parameters())
    shards.params.emplace_back(item.key(), item.value());
  for (const auto& [key, t] : model_entries(*state.model)) {
    if (key.starts_with("buffer.")) shards.buffers.emplace_back(key, t);
  }
  if (state.reducer->sharded()) {
    shards.layout = &state.reducer->layout();
    shards.param_blocks = state.reducer->parameter_shards();
  }
  shards.exp_avgs = state.exp_avgs;
  shards.exp_avg_sqs = state.exp_avg_sqs;
  shards.muon = state.muon;
  return shards;
}

}  // namespace

std::unique_ptr<PendingCheckpoint> Checkpointer::start_sharded(const std::string& step_dir,
                                                               int64_t steps_done,
                                                               const RunState& state) {
  const ShardedState shards = sharded_state_of(state);
  // The files: one per rank of the shard group (the world; hybrid, a node), written by the first
  // node's ranks (every node holds the same blocks), file f by the group's rank f.
  const int files = comms_.shard.size();
  const int index = comms_.shard.rank();
  const bool writes = comms_.replicas == nullptr || comms_.replicas->rank() == 0;
  const int rank = comms_.control.rank();
  auto p = std::make_unique<PendingCheckpoint>();
  p->path = step_dir;
  p->tmp = step_dir + ".tmp";
  p->steps_done = steps_done;
  p->sharded = true;
  const auto started = Clock::now();
  // Note [A bounded shard write]: written in the background, the file needs a host copy of this
  // rank's whole shard (its blocks of the parameters and both moments) that the next steps'
  // updates do not touch. Written now (checkpoint.async false), the step waits and nothing changes
  // the state meanwhile: the writer takes the state's own tensors one at a time (a device tensor
  // is copied to host memory one tensor at a time, io::SafetensorsWriter::write), so the write
  // holds at most one tensor beside the state, the bound under ddp.shard: parameters where a
  // shard copy may not fit (docs/DESIGN.md, "Checkpoints").
  std::map<std::string, at::Tensor> host;
  std::string failed;
  if (writes && options_.async) {
    failed = copy_to_host(shard_content(shards, files, index, true).tensors, host);
  } else if (writes) {
    host = shard_content(shards, files, index, true).tensors;  // views, written before the step
  }
  p->host_copy_s = seconds_since(started);
  const CheckpointMeta m = meta(steps_done, state);
  p->manifest = {
      m.world_size,
      std::string(ddp::kShardModeNames[static_cast<size_t>(state.reducer->shard_mode())]),
      m.step,
      m.global_batch_size,
      m.seed,
      m.config,
      logical_tensors(shards),
      {},
      m.schedule,
      m.base,
      m.base_hash};
  for (int f = 0; f < files; ++f) {  // every file's pieces; sizes and CRCs come with the votes
    p->manifest.files.push_back(
        {io::shard_file_name(f), f, 0, "", shard_content(shards, files, f, false).pieces});
  }
  p->write = launch_write(options_.async, [host = std::move(host), dir = p->tmp, writes, index,
                                           rank, steps_done, failed] {
    if (!failed.empty()) throw CheckpointError(failed);
    if (!writes) return std::string(kNothing);
    const std::string vote = vote_of(write_shard_file(dir, index, steps_done, host), index);
    pause_if_asked(rank, steps_done);
    return vote;
  });
  return p;
}

void Checkpointer::finish() {
  if (pending_ == nullptr) return;  // the same on every rank
  const std::unique_ptr<PendingCheckpoint> p = std::move(pending_);
  const auto waited_from = Clock::now();
  const WriteOutcome mine = p->write.get();
  const double waited = seconds_since(waited_from);
  const int rank = comms_.control.rank();
  if (rank == 0) {  // no other write is in flight: every rank is at this vote or writing p's
    for (const auto& left : remove_unfinished_writes(parent_dir(p->path), p->tmp)) {
      spdlog::info("removed {}, left by an interrupted checkpoint write", left);
    }
  }
  const auto voted_from = Clock::now();
  const auto votes = ddp::all_gather_strings(comms_.control, mine.vote);  // the one collective
  std::vector<int> votes_of(p->manifest.files.size(), 0);
  WriteFailure failure;
  for (int r = 0; r < comms_.control.size(); ++r) take_vote(*p, r, votes[r], votes_of, failure);
  for (size_t f = 0; f < votes_of.size() && failure.kind == WriteFailure::kNone; ++f) {
    if (votes_of[f] != 1) {
      throw std::logic_error(fmt::format("checkpoint {}: {} votes for {}", p->path, votes_of[f],
                                         p->manifest.files[f].file));
    }
  }
  if (failure.kind == WriteFailure::kNone && p->sharded) {
    // Rank 0's commit (the manifest, the renames) can fail too: its outcome is agreed as well.
    std::string commit = kNothing;
    if (rank == 0) commit = commit_vote(*p);
    note_failure(failure, ddp::all_gather_strings(comms_.control, commit)[0],
                 "rank 0 could not commit it");
  }
  if (failure.kind != WriteFailure::kNone) return give_up_or_go_on(*p, failure);
  failed_writes_ = 0;
  last_complete_ = p->path;
  if (rank != 0) return;
  log_written(*p, mine.seconds, waited, seconds_since(voted_from));
  // Older periodic checkpoints go only once the new one is complete (renamed into place).
  for (const auto& old : prune_checkpoints(options_.dir, options_.keep_last)) {
    spdlog::info("checkpoint.keep_last = {}: deleted {}", options_.keep_last, old);
  }
}

std::string Checkpointer::commit_vote(const PendingCheckpoint& p) {
  return launch_write(false,
                      [&p] {
                        commit_sharded_checkpoint(p.path, p.manifest);
                        return std::string(kNothing);
                      })
      .get()
      .vote;
}

void Checkpointer::give_up_or_go_on(const PendingCheckpoint& p, const WriteFailure& failure) {
  const int rank = comms_.control.rank();
  if (rank == 0) {  // every rank's write has ended (it voted): nothing of this one stays
    const bool removed = p.sharded ? remove_step_dir(p.tmp) : std::remove(p.tmp.c_str()) == 0;
    if (removed) spdlog::info("removed {}, the failed checkpoint write's partial files", p.tmp);
  }
  const std::string what = fmt::format("checkpoint {} ({} steps done) was not written: {}", p.path,
                                       p.steps_done, failure.message);
  const std::string last =
      last_complete_.empty() ? "none (this run wrote none and resumed from none)" : last_complete_;
  if (failure.kind == WriteFailure::kOther) throw CheckpointError(what);
  ++failed_writes_;
  if (failure.kind == WriteFailure::kFull && p.may_fail &&
      failed_writes_ < options_.max_failed_writes) {
    if (rank == 0) {
      spdlog::warn("{}. Training goes on and the next checkpoint tries again ({} of "
                   "checkpoint.max_failed_writes = {} failed in a row); the last complete "
                   "checkpoint: {}",
                   what, failed_writes_, options_.max_failed_writes, last);
    }
    return;
  }
  const std::string why =
      failure.kind == WriteFailure::kFull && p.may_fail
          ? fmt::format("; {} checkpoints failed in a row (checkpoint.max_failed_writes = {})",
                        failed_writes_, options_.max_failed_writes)
          : "";
  throw CheckpointNotWritten(
      fmt::format("{}{}. The last complete checkpoint: {}", what, why, last));
}

void Checkpointer::log_written(const PendingCheckpoint& p, double write_s, double waited_s,
                               double vote_s) const {
  const std::string what =
      p.sharded ? fmt::format(", {} shard files", p.manifest.files.size()) : "";
  const char* copied = p.sharded ? "host copy" : "gathers and host copy";
  // bench/checkpoint_stall.sh reads these lines (rank 0's times).
  if (options_.async) {
    spdlog::info("checkpoint written: {} ({} steps done{}): the step waited {:.3f} s ({}); in the "
                 "background, file and fsync {:.3f} s; then the run waited {:.3f} s for the write "
                 "and {:.3f} s for the vote and commit",
                 p.path, p.steps_done, what, p.host_copy_s, copied, write_s, waited_s, vote_s);
  } else {
    spdlog::info("checkpoint written: {} ({} steps done{}), the step waited {:.3f} s: {} {:.3f} "
                 "s, file and fsync {:.3f} s, vote and commit {:.3f} s",
                 p.path, p.steps_done, what, p.host_copy_s + write_s + vote_s, copied,
                 p.host_copy_s, write_s, vote_s);
  }
}

}  // namespace checkpoint
