// The desync verdict (ddp/desync.h) from given ranks' records: which ranks it names, and the
// exact lines. The MPI exchange itself is tested in tests/mpi/desync_test.cpp.
#include "ddp/desync.h"

#include <gtest/gtest.h>

namespace TRAINER_UNITY_ID {

using ddp::desync::OpKind;
using ddp::desync::OpRecord;
using ddp::desync::RankState;

OpRecord op(int64_t seq, int64_t step, OpKind kind, const char* what) {
  OpRecord r;
  r.seq = seq;
  r.step = step;
  r.kind = kind;
  std::snprintf(r.what, sizeof(r.what), "%s", what);
  return r;
}

// A rank whose tracker 1 (the data communicator) posted `posted` and completed `completed`, and
// which waits in `waiting` of tracker `waiting_tracker`.
RankState rank_state(int rank, OpRecord posted, OpRecord completed, OpRecord waiting,
                     int waiting_tracker = 1) {
  RankState s;
  s.rank = rank;
  s.waiting_tracker = waiting_tracker;
  s.waiting = waiting;
  s.trackers = 2;
  s.tracker[0] = {1, posted, completed};
  s.tracker[1] = {0, op(40, 57, OpKind::kAllReduceSum, "status vote"),
                  op(40, 57, OpKind::kAllReduceSum, "status vote")};
  return s;
}

const OpRecord kBucket3 = op(120, 58, OpKind::kAllReduceSum, "bucket 3");
const OpRecord kBucket19 = op(117, 57, OpKind::kAllReduceSum, "bucket 19");
const OpRecord kBucket2 = op(119, 58, OpKind::kAllReduceSum, "bucket 2");

TEST(Desync, NamesTheRankThatDidNotReachTheCollective) {
  const RankState mine =
      rank_state(0, op(125, 58, OpKind::kAllReduceSum, "bucket 0"), kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(3);
  // Rank 1 completed step 57 and waits in the next status vote, on the control communicator.
  answers[1] = rank_state(1, kBucket19, kBucket19, op(41, 58, OpKind::kAllReduceMax, "status vote"),
                          /*tracker=*/0);
  answers[2] = rank_state(2, op(125, 58, OpKind::kAllReduceSum, "bucket 0"), kBucket2, kBucket3);
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0),
            "desync check, answers from rank(s) 0, 1, 2 of 3 within 5 s:\n"
            "  rank 1 did not reach the all_reduce(sum) of bucket 3 at step 58 (last completed: "
            "step 57, all_reduce(sum) of bucket 19; it waits in the all_reduce(max) of status "
            "vote at step 58)\n");
}

TEST(Desync, NamesARankThatDidNotAnswer) {
  const RankState mine = rank_state(2, kBucket3, kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(3);
  answers[0] = rank_state(0, kBucket3, kBucket2, kBucket3);
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 2.5),
            "desync check, answers from rank(s) 0, 2 of 3 within 2.5 s:\n"
            "  rank 1 did not reach the all_reduce(sum) of bucket 3 at step 58, or is stuck in "
            "it: no answer within 2.5 s (stopped, dead, or busy outside the collectives; last "
            "completed on rank 2: step 58, all_reduce(sum) of bucket 2)\n");
}

TEST(Desync, RanksAheadOrLevelAreNotNamed) {
  const RankState mine = rank_state(1, kBucket3, kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(5);
  answers[0] = rank_state(0, op(125, 58, OpKind::kAllReduceSum, "bucket 0"), kBucket2, kBucket3);
  answers[2] = rank_state(2, kBucket3, kBucket2, kBucket3);
  answers[3] = rank_state(3, kBucket19, kBucket19, kBucket19);
  // One operation behind: it posted bucket 2, then went to the vote instead of bucket 3.
  answers[4] = rank_state(4, kBucket2, kBucket2, op(41, 58, OpKind::kAllReduceMax, "status vote"),
                          /*tracker=*/0);
  const std::string v = ddp::desync::verdict(mine, answers, 5.0);
  EXPECT_EQ(v.find("rank 0 did not"), std::string::npos) << v;
  EXPECT_EQ(v.find("rank 2 did not"), std::string::npos) << v;
  EXPECT_NE(v.find("rank 3 did not reach the all_reduce(sum) of bucket 3 at step 58 (last "
                   "completed: step 57, all_reduce(sum) of bucket 19; it waits in the "
                   "all_reduce(sum) of bucket 19 at step 57)"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("rank 4 did not reach the all_reduce(sum) of bucket 3 at step 58 (last "
                   "completed: step 58, all_reduce(sum) of bucket 2; it waits in the "
                   "all_reduce(max) of status vote at step 58)"),
            std::string::npos)
      << v;
}

TEST(Desync, EveryRankPresentSaysSo) {
  const RankState mine = rank_state(0, kBucket3, kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(2);
  answers[1] = rank_state(1, kBucket3, kBucket2, kBucket3);
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0),
            "desync check, answers from rank(s) 0, 1 of 2 within 5 s: every rank posted the "
            "all_reduce(sum) of bucket 3 at step 58; none is missing from it (a slow network or "
            "a rank stuck inside it)\n");
}

// The stopped rank, woken while the job is killed, finds everyone's answers waiting: they all
// posted the operation, and its own lateness is what gives it away.
TEST(Desync, ALateRankSaysItWasNotRunning) {
  RankState mine = rank_state(1, kBucket3, kBucket2, kBucket3);
  mine.late_s = 5.04;
  std::vector<std::optional<RankState>> answers(2);
  answers[0] = rank_state(0, kBucket3, kBucket2, kBucket3);
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0),
            "desync check, answers from rank(s) 0, 1 of 2 within 5 s: every rank posted the "
            "all_reduce(sum) of bucket 3 at step 58; none is missing from it (a slow network or "
            "a rank stuck inside it)\n"
            "  rank 1 itself noticed the timeout 5.0 s late: it was stopped or starved, and may "
            "be the rank the others wait for\n");
  mine.late_s = 0.3;
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0).find("late"), std::string::npos);
}

// The same rank's answer, seen by a rank whose exchange was still open when it woke.
TEST(Desync, ALateAnswerNamesItsRank) {
  const RankState mine = rank_state(2, kBucket3, kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(3);
  answers[0] = rank_state(0, kBucket3, kBucket2, kBucket3);
  answers[1] = rank_state(1, kBucket3, kBucket2, kBucket3);
  answers[1]->late_s = 5.0;
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0),
            "desync check, answers from rank(s) 0, 1, 2 of 3 within 5 s:\n"
            "  rank 1 noticed its own timeout 5.0 s late: it was stopped or starved, and is "
            "likely the rank the others waited for\n");
}

TEST(Desync, DifferentCollectivesAtTheSamePlaceAreNamed) {
  const RankState mine = rank_state(0, kBucket3, kBucket2, kBucket3);
  std::vector<std::optional<RankState>> answers(2);
  const OpRecord gather = op(120, 58, OpKind::kAllGather, "bucket 3");
  answers[1] = rank_state(1, gather, kBucket2, gather);
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 5.0),
            "desync check, answers from rank(s) 0, 1 of 2 within 5 s:\n"
            "  rank 1 waits in the all_gather of bucket 3 at step 58 as its operation 120 on this "
            "communicator, where rank 0 waits in the all_reduce(sum) of bucket 3 at step 58: the "
            "ranks issue different collectives\n");
}

TEST(Desync, StartUpAndMissingCommunicator) {
  const OpRecord vote = op(2, -1, OpKind::kAllReduceMax, "start-up vote");
  RankState mine = rank_state(0, vote, op(1, -1, OpKind::kBroadcast, "config"), vote);
  std::vector<std::optional<RankState>> answers(2);
  RankState other = rank_state(1, vote, vote, vote);
  other.trackers = 1;
  other.tracker[0].id = 7;  // it has not made the communicator rank 0 waits on
  answers[1] = other;
  EXPECT_EQ(ddp::desync::verdict(mine, answers, 1.0),
            "desync check, answers from rank(s) 0, 1 of 2 within 1 s:\n"
            "  rank 1 did not reach the all_reduce(max) of start-up vote during start-up (before "
            "step 1) (last completed: none)\n");
}

TEST(Desync, RecordsTruncateAndTrackersCount) {
  ddp::desync::Tracker t;
  const OpRecord a = t.post(OpKind::kBarrier, std::string(100, 'x'), 3);
  EXPECT_EQ(a.seq, 1);
  EXPECT_EQ(std::string(a.what), std::string(sizeof(a.what) - 1, 'x'));
  const OpRecord b = t.post(OpKind::kBroadcast, "resume step", 3);
  EXPECT_EQ(b.seq, 2);
  t.complete(b);
  t.complete(a);  // completions seen out of order keep the latest
  EXPECT_EQ(t.last_completed().seq, 2);
  EXPECT_EQ(t.last_posted().seq, 2);
  EXPECT_EQ(ddp::desync::describe(b), "broadcast of resume step at step 3");
  const RankState s = ddp::desync::snapshot(0, t.id(), b);
  ASSERT_GE(s.trackers, 1);
  EXPECT_EQ(s.tracker[0].id, t.id());  // the timed-out tracker comes first
  EXPECT_EQ(s.tracker[0].posted.seq, 2);
}

TEST(Desync, DeadlineIsShort) {
  EXPECT_DOUBLE_EQ(ddp::desync::exchange_deadline(std::chrono::seconds(600)).count(), 5.0);
  EXPECT_DOUBLE_EQ(ddp::desync::exchange_deadline(std::chrono::seconds(4)).count(), 2.0);
}

}  // namespace TRAINER_UNITY_ID
