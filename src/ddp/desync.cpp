#include "ddp/desync.h"

#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "ddp/kept.h"

namespace ddp::desync {

OpKind all_reduce_kind(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return OpKind::kAllReduceSum;
    case ReduceOp::kAvg: return OpKind::kAllReduceAvg;
    case ReduceOp::kMax: return OpKind::kAllReduceMax;
    case ReduceOp::kMin: return OpKind::kAllReduceMin;
  }
  return OpKind::kAllReduceSum;
}

OpKind reduce_scatter_kind(ReduceOp op) {
  return op == ReduceOp::kAvg ? OpKind::kReduceScatterAvg : OpKind::kReduceScatterSum;
}

std::string_view kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kNone: return "nothing";
    case OpKind::kAllReduceSum: return "all_reduce(sum)";
    case OpKind::kAllReduceAvg: return "all_reduce(avg)";
    case OpKind::kAllReduceMax: return "all_reduce(max)";
    case OpKind::kAllReduceMin: return "all_reduce(min)";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatterSum: return "reduce_scatter(sum)";
    case OpKind::kReduceScatterAvg: return "reduce_scatter(avg)";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

namespace {

std::string what_of(const OpRecord& op) {
  return std::string(op.what, strnlen(op.what, sizeof(op.what)));
}

std::string op_name(const OpRecord& op) {
  return fmt::format("{} of {}", kind_name(op.kind), what_of(op));
}

// "step 57, all_reduce(sum) of bucket 19", "start-up, broadcast of ...", "none".
std::string step_then_op(const OpRecord& op) {
  if (op.empty()) return "none";
  return fmt::format("{}, {}", op.step >= 1 ? fmt::format("step {}", op.step) : "start-up",
                     op_name(op));
}

bool same_op(const OpRecord& a, const OpRecord& b) {
  return a.kind == b.kind && std::strncmp(a.what, b.what, sizeof(a.what)) == 0;
}

// The process's trackers, in creation order.
struct Registry {
  std::mutex mutex;
  std::vector<const Tracker*> live;
  int next_id = 0;
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::string describe(const OpRecord& op) {
  return fmt::format("{} {}", op_name(op), Communicator::when(op.step));
}

Tracker::Tracker() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  id_ = r.next_id++;
  r.live.push_back(this);
}

Tracker::~Tracker() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), this), r.live.end());
}

OpRecord Tracker::post(OpKind kind, std::string_view what, int64_t step) noexcept {
  OpRecord op;
  op.seq = posted_.seq + 1;
  op.step = step;
  op.kind = kind;
  const size_t n = std::min(what.size(), sizeof(op.what) - 1);
  std::memcpy(op.what, what.data(), n);
  op.what[n] = '\0';
  posted_ = op;
  return op;
}

void Tracker::complete(const OpRecord& op) noexcept {
  if (op.seq > completed_.seq) completed_ = op;
}

const TrackerState* RankState::find(int32_t id) const {
  for (int32_t i = 0; i < std::min(trackers, kMaxTrackers); ++i) {
    if (tracker[i].id == id) return &tracker[i];
  }
  return nullptr;
}

RankState snapshot(int rank, int tracker_id, const OpRecord& waiting, double late_s) {
  RankState s;
  s.rank = rank;
  s.late_s = late_s;
  s.waiting_tracker = tracker_id;
  s.waiting = waiting;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // The timed-out tracker first, then the newest others.
  std::vector<const Tracker*> order(r.live.rbegin(), r.live.rend());
  std::stable_partition(order.begin(), order.end(),
                        [&](const Tracker* t) { return t->id() == tracker_id; });
  for (const Tracker* t : order) {
    if (s.trackers == kMaxTrackers) break;
    s.tracker[s.trackers++] = TrackerState{t->id(), t->last_posted(), t->last_completed()};
  }
  return s;
}

// A rank that noticed its timeout this late was not running for part of its wait.
constexpr double kLateS = 1.0;

std::string verdict(const RankState& mine, const std::vector<std::optional<RankState>>& answers,
                    double deadline_s) {
  const OpRecord& w = mine.waiting;
  const TrackerState* my_tracker = mine.find(mine.waiting_tracker);
  const OpRecord here = my_tracker != nullptr ? my_tracker->completed : OpRecord{};
  std::vector<int> answered{mine.rank};
  std::string lines;
  for (int r = 0; r < static_cast<int>(answers.size()); ++r) {
    if (r == mine.rank) continue;
    if (!answers[r]) {
      lines += fmt::format(
          "  rank {} did not reach the {}, or is stuck in it: no answer within {:g} s "
          "(stopped, dead, or busy outside the collectives; last completed on rank {}: {})\n",
          r, describe(w), deadline_s, mine.rank, step_then_op(here));
      continue;
    }
    answered.push_back(r);
    const RankState& a = *answers[r];
    if (a.late_s >= kLateS) {
      lines += fmt::format("  rank {} noticed its own timeout {:.1f} s late: it was stopped or "
                           "starved, and is likely the rank the others waited for\n",
                           r, a.late_s);
    }
    const TrackerState* t = a.find(mine.waiting_tracker);
    const OpRecord posted = t != nullptr ? t->posted : OpRecord{};
    const OpRecord completed = t != nullptr ? t->completed : OpRecord{};
    const bool waits_elsewhere =
        a.waiting_tracker != mine.waiting_tracker || a.waiting.seq != w.seq;
    if (posted.seq < w.seq) {
      lines +=
          fmt::format("  rank {} did not reach the {} (last completed: {}{})\n", r, describe(w),
                      step_then_op(completed),
                      waits_elsewhere ? fmt::format("; it waits in the {}", describe(a.waiting))
                                      : std::string());
    } else if (!waits_elsewhere && !same_op(a.waiting, w)) {
      lines += fmt::format(
          "  rank {} waits in the {} as its operation {} on this communicator, where rank {} "
          "waits in the {}: the ranks issue different collectives\n",
          r, describe(a.waiting), w.seq, mine.rank, describe(w));
    }
  }
  std::string note;
  if (mine.late_s >= kLateS) {
    note = fmt::format("  rank {} itself noticed the timeout {:.1f} s late: it was stopped or "
                       "starved, and may be the rank the others wait for\n",
                       mine.rank, mine.late_s);
  }
  std::sort(answered.begin(), answered.end());
  std::string header = fmt::format("desync check, answers from rank(s) {} of {} within {:g} s:",
                                   fmt::join(answered, ", "), answers.size(), deadline_s);
  if (lines.empty()) {
    return header +
           fmt::format(" every rank posted the {}; none is missing from it (a slow "
                       "network or a rank stuck inside it)\n",
                       describe(w)) +
           note;
  }
  return header + "\n" + lines + note;
}

std::chrono::duration<double> exchange_deadline(std::chrono::duration<double> timeout) {
  return std::min(std::chrono::duration<double>(5.0), timeout / 2);
}

namespace {

MPI_Comm g_plane = MPI_COMM_NULL;
constexpr int kExchangeTag = 0x5e9c;  // below 32767, the smallest MPI_TAG_UB MPI allows

bool mpi_alive() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// An answer left over from an earlier exchange that this rank never joined (possible only where
// a timeout is caught and work goes on, as in the MPI tests): the operation its sender waited in
// has since completed here, or its communicator is gone.
bool stale(const RankState& a) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (a.waiting_tracker >= r.next_id) return false;  // a communicator this rank has yet to make
  for (const Tracker* t : r.live) {
    if (t->id() == a.waiting_tracker) return t->last_completed().seq >= a.waiting.seq;
  }
  return true;
}

}  // namespace

void open_control_plane() {
  if (g_plane != MPI_COMM_NULL) return;
  MPI_Comm plane = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &plane) != MPI_SUCCESS) return;
  MPI_Comm_set_errhandler(plane, MPI_ERRORS_RETURN);
  g_plane = plane;
}

void close_control_plane() noexcept {
  // Requests an exchange gave up on may still be posted: MPI_Comm_free only marks the
  // communicator for freeing once they are done.
  if (g_plane != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&g_plane);
  g_plane = MPI_COMM_NULL;
}

namespace {

using Clock = std::chrono::steady_clock;

// Sends `mine` to every other rank and posts a receive for each one's answer into `inbox`.
void post_exchange(const RankState* mine, std::vector<RankState>& inbox,
                   std::vector<MPI_Request>& recvs, int rank) {
  const int bytes = static_cast<int>(sizeof(RankState));
  for (int r = 0; r < static_cast<int>(recvs.size()); ++r) {
    if (r == rank) continue;
    MPI_Request send = MPI_REQUEST_NULL;
    // Never waited for: a small message leaves at once; one to a dead peer may never.
    if (MPI_Isend(mine, bytes, MPI_BYTE, r, kExchangeTag, g_plane, &send) == MPI_SUCCESS &&
        send != MPI_REQUEST_NULL) {
      MPI_Request_free(&send);
    }
    if (MPI_Irecv(&inbox[r], bytes, MPI_BYTE, r, kExchangeTag, g_plane, &recvs[r]) != MPI_SUCCESS) {
      recvs[r] = MPI_REQUEST_NULL;
    }
  }
}

// Tests the receives until every rank answered or `deadline` passed. A stale answer (of an
// earlier exchange) is dropped and the receive posted again.
std::vector<std::optional<RankState>> collect_answers(std::vector<RankState>& inbox,
                                                      std::vector<MPI_Request>& recvs,
                                                      Clock::time_point deadline) {
  const int bytes = static_cast<int>(sizeof(RankState));
  std::vector<std::optional<RankState>> answers(recvs.size());
  for (;;) {
    int pending = 0;
    for (int r = 0; r < static_cast<int>(recvs.size()); ++r) {
      if (recvs[r] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      if (MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        recvs[r] = MPI_REQUEST_NULL;  // a broken link: no answer from r
        continue;
      }
      if (!flag) {
        ++pending;
        continue;
      }
      const RankState& a = inbox[r];
      if (a.rank == r && !stale(a)) {
        answers[r] = a;
      } else if (MPI_Irecv(&inbox[r], bytes, MPI_BYTE, r, kExchangeTag, g_plane, &recvs[r]) ==
                 MPI_SUCCESS) {
        ++pending;  // wait for r's answer to this timeout
      }
    }
    if (pending == 0 || Clock::now() > deadline) return answers;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Cancels the unanswered receives, so that no later exchange's answer lands in them; true when
// none is left posted (their buffer may be freed).
bool cancel_receives(std::vector<MPI_Request>& recvs) {
  for (MPI_Request& req : recvs) {
    if (req == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&req);
    int flag = 0;
    for (int i = 0; i < 100 && req != MPI_REQUEST_NULL && !flag; ++i) {
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return std::all_of(recvs.begin(), recvs.end(),
                     [](MPI_Request q) { return q == MPI_REQUEST_NULL; });
}

// The lowest rank that answered speaks first: the others hold their message (and their abort of
// the job) back a little, so the job's output shows that rank's diagnosis.
void let_lowest_speak_first(const std::vector<std::optional<RankState>>& answers, int rank,
                            std::chrono::duration<double> deadline_s) {
  const int first = static_cast<int>(
      std::find_if(answers.begin(), answers.end(), [](const auto& a) { return a.has_value(); }) -
      answers.begin());
  if (first < rank) {
    std::this_thread::sleep_for(std::min(deadline_s, std::chrono::duration<double>(0.5)));
  }
}

std::mutex g_outcome_mutex;
ExchangeOutcome g_outcome;

void record_outcome(const std::vector<std::optional<RankState>>& answers, int rank, int64_t step) {
  ExchangeOutcome outcome;
  outcome.ran = true;
  outcome.step = step;
  for (int r = 0; r < static_cast<int>(answers.size()); ++r) {
    if (r != rank && !answers[r]) outcome.silent.push_back(r);
  }
  const std::lock_guard lock(g_outcome_mutex);
  g_outcome = std::move(outcome);
}

}  // namespace

ExchangeOutcome last_exchange() {
  const std::lock_guard lock(g_outcome_mutex);
  return g_outcome;
}

std::string diagnose(const Tracker& tracker, const OpRecord& waiting,
                     std::chrono::duration<double> timeout,
                     std::chrono::duration<double> waited) noexcept {
  try {
    if (g_plane == MPI_COMM_NULL || !mpi_alive()) return {};
    int rank = 0;
    int size = 1;
    MPI_Comm_rank(g_plane, &rank);
    MPI_Comm_size(g_plane, &size);
    if (size < 2) return {};
    const auto deadline_s = exchange_deadline(timeout);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline_s);

    // `mine` is kept until the process ends (under 1 KB per timeout): the sends are never waited
    // for, so their buffer must outlive them; `inbox` too when a receive could not be cancelled.
    RankState* mine = &keep_until_exit(
        RankState(snapshot(rank, tracker.id(), waiting, (waited - timeout).count())));
    auto inbox = std::make_unique<std::vector<RankState>>(size);
    std::vector<MPI_Request> recvs(size, MPI_REQUEST_NULL);
    post_exchange(mine, *inbox, recvs, rank);
    const auto answers = collect_answers(*inbox, recvs, deadline);
    if (!cancel_receives(recvs)) keep_until_exit(std::move(inbox));
    record_outcome(answers, rank, waiting.step);

    std::string out(1, '\n');
    out += verdict(*mine, answers, deadline_s.count());
    out.pop_back();  // the message ends with the verdict's last line, without its '\n'
    let_lowest_speak_first(answers, rank, deadline_s);
    return out;
  } catch (...) {
    return {};
  }
}

}  // namespace ddp::desync
