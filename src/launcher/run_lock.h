// RunLock: one training run at a time writes into a checkpoint.dir, and into a metrics file or a
// TensorBoard directory outside it (docs/DESIGN.md, "One run per output directory"). A second run
// into the same place is refused at start-up, naming the run that holds it, instead of both
// overwriting each other's step_* files and interleaving their lines in one metrics.jsonl.
//
// Note [Run lock]
// - The lock is flock(2) on a lock file (DIR/trainer.lock; PATH.lock beside a metrics file outside
//   checkpoint.dir), taken by rank 0 during start-up's `prepare` phase and held for the process's
//   lifetime. The kernel releases it when the process ends however it ends (exit, MPI_Abort,
//   kill -9, SLURM's SIGKILL), so a lock is never "stale": a run after a killed or requeued one
//   takes it at once. A lock FILE always stays behind (it is never unlinked: unlinking a lock file
//   races with a process opening it); what it says is only a record of who held it last. A clean
//   exit empties it, so a record left in a free lock names a holder that ended without a clean
//   exit, which the next run reports.
// - flock, not fcntl record locks: an fcntl lock belongs to the process and is dropped when the
//   process closes ANY descriptor of the file, so any code that opened and closed the lock file
//   would release it; flock belongs to the open file description, held only by this object's
//   descriptor (opened O_CLOEXEC, so no launched child inherits it).
// - Across nodes: on Linux NFS (v3 through lockd, v4 natively) the client emulates flock with a
//   whole-file byte-range lock on the server, so two nodes exclude each other, unless the file
//   system is mounted with local_lock=flock (or all), or Lustre with localflock (node-local locks)
//   or without flock (then flock fails: the run warns that it cannot lock and goes on). A node that
//   dies keeps its NFS locks on the server until its lease expires (NFSv4: 90 s by default) or,
//   under NFSv3, until the node reboots and tells the server.
// - The record is one line of JSON: host, pid, start time (Unix seconds), SLURM job id, restart
//   count and cluster, written after the lock is taken and fsync'd (a holder on another node is
//   read through the server). A reader that finds it empty retries for a second (the holder may be
//   between taking the lock and writing).
// - SLURM requeue: a requeued job (same SLURM_JOB_ID, SLURM_RESTART_COUNT + 1) may start before
//   its previous run's processes are gone: slurm/train.sbatch restarts on the surviving nodes as
//   soon as srun returns, and SLURM requeues the job of a node it declared dead while that node's
//   processes (or its file-system lease) may still be alive. So a lock held by another run of the
//   SAME job (same SLURM_JOB_ID and cluster) is waited for, polling, up to `same_job_grace`
//   (120 s by default: SLURM's default KillWait of 30 s and NFSv4's default lease of 90 s), and
//   taken when it goes. A holder still alive after that is still writing, or its node's locks
//   outlived it: the run is refused like any other, naming it. A lock is never broken: two runs
//   writing one directory is worse than a job that stops and says why.
// - Several places (checkpoint.dir, a metrics file, a TensorBoard directory) are locked in the
//   order of their lock files' paths, all or none: two runs that share some of them never hold
//   one each and wait for the other.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch.h"

namespace launcher {

// Who holds (or last held) a lock: what its lock file records.
struct LockHolder {
  std::string host;
  int64_t pid = 0;
  int64_t started = 0;        // Unix seconds, when it took the lock (its start-up)
  std::string slurm_job;      // SLURM_JOB_ID; "" outside SLURM
  std::string slurm_restart;  // SLURM_RESTART_COUNT; "" for a job never requeued
  std::string slurm_cluster;  // SLURM_CLUSTER_NAME

  // This process, on `host`, now, with the SLURM variables of `env`.
  static LockHolder this_process(const std::string& host, const EnvLookup& env);
  std::string to_json() const;
  // nullopt for text that is not a record (empty, or cut short while it was being written).
  static std::optional<LockHolder> parse(const std::string& text);
  // "host n1, pid 4242, started 2026-05-01 12:00:03 UTC (125 s ago), SLURM job 77 (restart 1)"
  std::string describe(int64_t now) const;
  // Both are runs of one SLURM job (a requeued or restarted job and its earlier run).
  bool same_slurm_job(const LockHolder& other) const;
};

// A place a run writes, and the file that locks it.
struct LockPlace {
  std::string key;        // the config key naming it: "checkpoint.dir", "log.metrics", ...
  std::string target;     // the directory or file as configured
  std::string lock_file;  // DIR/trainer.lock, or PATH.lock for a file
};

inline constexpr const char* kLockFileName = "trainer.lock";

// The places a training run writes: checkpoint.dir; the metrics file and the TensorBoard directory
// where they lie outside checkpoint.dir (inside it, its lock covers them); "" for what is not set.
// Sorted by lock file: every run takes them in the same order.
std::vector<LockPlace> output_places(const std::string& checkpoint_dir, const std::string& metrics,
                                     const std::string& tensorboard);

// A place is in use by another run: exit 2 (a launch mistake, start-up's table).
class OutputsInUse : public LaunchError {
 public:
  using LaunchError::LaunchError;
};

class RunLock {
 public:
  struct Options {
    // How long to wait for another run of this process's own SLURM job (see the note).
    std::chrono::duration<double> same_job_grace{120.0};
    std::chrono::duration<double> poll{0.5};
  };

  // Locks every place, or none: a place another run holds throws OutputsInUse naming the place,
  // its lock file and the holder (after waiting up to options.same_job_grace when the holder is
  // another run of `me`'s SLURM job). A lock file that cannot be created is a LaunchError naming
  // the key; a file system that does not support flock is noted (notes()) and that place goes
  // unlocked. Never blocks on a lock itself (LOCK_NB, polled).
  static std::unique_ptr<RunLock> take(const std::vector<LockPlace>& places, const LockHolder& me,
                                       const Options& options);
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // A clean end: empties each lock file (no record: nobody holds it) and releases it.
  ~RunLock();

  // What rank 0 logs about taking the locks: a record left by a holder that ended without a clean
  // exit, a wait for this job's earlier run, a place left unlocked.
  const std::vector<std::string>& notes() const { return notes_; }
  // The lock files held.
  std::vector<std::string> files() const;

 private:
  struct Held {
    LockPlace place;
    int fd = -1;
  };
  // Another process holds `place`'s lock; `holder` is what its lock file says.
  struct Busy {
    LockPlace place;
    std::optional<LockHolder> holder;
  };
  RunLock() = default;
  // Tries every place once, in order; at a busy one releases what it took and returns it.
  std::optional<Busy> try_all(const std::vector<LockPlace>& places, const LockHolder& me);
  // Empties and closes every lock held (a clean end, or a retry).
  void release() noexcept;

  std::vector<Held> held_;
  std::vector<std::string> notes_;
};

}  // namespace launcher
