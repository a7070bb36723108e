// Desync diagnosis: when a collective misses ddp.timeout_s, name the rank that is missing.
//
// - Recording (hot path, no allocation, no formatting): every communicator that spans the whole
//   job owns a Tracker, and so do hybrid sharding's node and cross-node communicators (made on
//   every rank in the same order, with the same role everywhere: MpiCommunicator's `tracked`).
//   Posting an operation takes the next sequence number and copies what it is (kind, the caller's
//   `what`, truncated, and the step) into a fixed-size OpRecord; the Work hands that record back
//   when it completes. The tracker keeps the last posted and the last completed record.
// - Exchange (on a timeout, before CommTimeout is thrown): the timed-out rank sends the records
//   of every tracker of its process, and which operation it waits in, to every other rank, and
//   collects theirs: point-to-point (MPI_Isend/MPI_Irecv, tag kExchangeTag) on a control-plane
//   communicator of its own (a duplicate of MPI_COMM_WORLD made at start-up that carries nothing
//   else), polled with MPI_Test against a short deadline (exchange_deadline()). A stalled peer
//   waits in the same collective, times out at about the same moment and answers with its own
//   exchange; a rank that is stopped, dead, or computing without calling a collective does not
//   answer, and is named as such.
// - Verdict (pure, verdict()): ranks whose last posted operation on the timed-out communicator
//   comes before the one this rank waits in did not reach it; ranks that did not answer may not
//   have reached it or be stuck in it.
//
// Threading: trackers are written by the thread that uses their communicator (one at a time, as
// the Communicator contract says); the exchange reads every tracker of the process from the
// thread that timed out, which in the trainer is the same training thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/communicator.h"

namespace ddp::desync {

enum class OpKind : int32_t {
  kNone = 0,
  kAllReduceSum,
  kAllReduceAvg,
  kAllReduceMax,
  kAllReduceMin,
  kBroadcast,
  kAllGather,
  kReduceScatterSum,
  kReduceScatterAvg,
  kBarrier,
};
OpKind all_reduce_kind(ReduceOp op);
OpKind reduce_scatter_kind(ReduceOp op);
std::string_view kind_name(OpKind kind);  // "all_reduce(sum)", "broadcast", ...

// One operation as a tracker saw it: plain bytes, sent as they are between ranks of one build.
struct OpRecord {
  int64_t seq = 0;  // 1, 2, ... per tracker; 0: none yet
  int64_t step = -1;
  OpKind kind = OpKind::kNone;
  char what[44] = {};  // the caller's `what`, truncated, NUL-terminated

  bool empty() const { return seq == 0; }
};
// "all_reduce(sum) of bucket 3 at step 58" ("... during start-up (before step 1)").
std::string describe(const OpRecord& op);

// The operations of one communicator. Tracker ids count the trackers this process created; every
// rank creates its whole-job communicators in the same order (creating one is collective), so an
// id names the same communicator on every rank.
class Tracker {
 public:
  Tracker();  // registers with the process
  ~Tracker();
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  int id() const { return id_; }
  // Records a newly posted operation and returns its record (kept by its Work).
  OpRecord post(OpKind kind, std::string_view what, int64_t step) noexcept;
  void complete(const OpRecord& op) noexcept;
  const OpRecord& last_posted() const { return posted_; }
  const OpRecord& last_completed() const { return completed_; }

 private:
  int id_;
  OpRecord posted_;
  OpRecord completed_;
};

// What one rank tells the others in an exchange.
inline constexpr int kMaxTrackers = 6;
struct TrackerState {
  int32_t id = -1;
  OpRecord posted;
  OpRecord completed;
};
struct RankState {
  int32_t rank = -1;
  int32_t waiting_tracker = -1;  // the tracker of the operation that timed out
  OpRecord waiting;
  // How long past its deadline the rank noticed the timeout: a second or more means it was not
  // running itself (stopped, starved) and is likely the rank the others wait for.
  double late_s = 0;
  int32_t trackers = 0;
  TrackerState tracker[kMaxTrackers];

  const TrackerState* find(int32_t id) const;
};

// This process's state, waiting in `waiting` of tracker `tracker_id`, `late_s` late.
RankState snapshot(int rank, int tracker_id, const OpRecord& waiting, double late_s = 0);

// The verdict lines (each ending in '\n') from this rank's state and the answers of every rank
// (answers[r] empty: rank r did not answer within `deadline_s`; answers[mine.rank] is ignored).
// Pure; tests/unit/desync_test.cpp.
std::string verdict(const RankState& mine, const std::vector<std::optional<RankState>>& answers,
                    double deadline_s);

// How long an exchange waits for answers: min(5 s, half of ddp.timeout_s).
std::chrono::duration<double> exchange_deadline(std::chrono::duration<double> timeout);

// The control-plane communicator of the exchange: opened after MPI_Init (collective), closed
// before MPI_Finalize (MpiRuntime does both). Without it diagnose() adds nothing.
void open_control_plane();
void close_control_plane() noexcept;

// Runs the exchange for an operation of `tracker` that missed `timeout` (noticed after `waited`)
// and returns what to append to the timeout's message: a new line and the verdict, or nothing
// (the world has one rank, there is no control plane, or the exchange failed). Never throws.
std::string diagnose(const Tracker& tracker, const OpRecord& waiting,
                     std::chrono::duration<double> timeout,
                     std::chrono::duration<double> waited) noexcept;

// What this process's last exchange found, for the launcher's failure file
// (launcher/failure_file.h): the ranks that did not answer.
struct ExchangeOutcome {
  bool ran = false;
  int64_t step = -1;  // the step of the operation that timed out here (-1: during start-up)
  std::vector<int> silent;
};
ExchangeOutcome last_exchange();

}  // namespace ddp::desync
