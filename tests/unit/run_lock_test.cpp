// RunLock (launcher/run_lock.h): one run at a time in a checkpoint.dir. Another run is played by
// a second lock in this process (flock locks belong to open file descriptions, so two of one
// process exclude each other) or by a forked child that locks the file with raw system calls and
// then ends the way a run may end (killed, or after a while).

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/temp_dir.h"
#include "launcher/run_lock.h"

namespace launcher {
namespace TRAINER_UNITY_ID {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

LockHolder holder(const std::string& host, int64_t pid, const std::string& job = "") {
  return {host, pid, 1777777777, job, job.empty() ? "" : "0", job.empty() ? "" : "ci"};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<LockPlace> dir_place(const test::TempDir& dir) {
  return output_places(dir.path(), "", "");
}

RunLock::Options fast(std::chrono::duration<double> grace) {
  RunLock::Options o;
  o.same_job_grace = grace;
  o.poll = 20ms;
  return o;
}

// A child process that locks `file`, records `record` in it, tells the parent, then waits
// `hold_ms` and ends by `how` (SIGKILL: killed; 0: a plain _exit that leaves the record).
class Holder {
 public:
  Holder(const std::string& file, const std::string& record, int hold_ms, int how) {
    int ready[2];
    if (::pipe(ready) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {  // only async-signal-safe calls from here on
      const int fd = ::open(file.c_str(), O_RDWR | O_CREAT, 0644);
      if (fd < 0 || ::flock(fd, LOCK_EX) != 0 || ::ftruncate(fd, 0) != 0 ||
          ::write(fd, record.data(), record.size()) != static_cast<ssize_t>(record.size())) {
        ::_exit(3);
      }
      const char one = 1;
      if (::write(ready[1], &one, 1) != 1) ::_exit(3);
      ::usleep(static_cast<useconds_t>(hold_ms) * 1000);
      if (how == SIGKILL) ::raise(SIGKILL);
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    const bool locked = ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    if (!locked) throw std::runtime_error("the child could not lock " + file);
  }
  ~Holder() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  void wait() { ::waitpid(pid_, nullptr, 0); }

 private:
  pid_t pid_ = -1;
};

TEST(RunLock, TakesAFreeDirectoryAndRecordsItsHolder) {
  test::TempDir dir;
  const auto lock = RunLock::take(dir_place(dir), holder("n1", 4242), fast(0s));
  ASSERT_EQ(lock->files(), std::vector<std::string>{dir.file("trainer.lock")});
  const auto record = LockHolder::parse(read_file(dir.file("trainer.lock")));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->host, "n1");
  EXPECT_EQ(record->pid, 4242);
  EXPECT_TRUE(lock->notes().empty());
}

TEST(RunLock, ASecondRunIsRefusedNamingTheHolder) {
  test::TempDir dir;
  const auto first = RunLock::take(dir_place(dir), holder("n1", 4242, "77"), fast(0s));
  try {
    RunLock::take(dir_place(dir), holder("n2", 99), fast(10s));
    FAIL() << "a second run into the same checkpoint.dir was not refused";
  } catch (const OutputsInUse& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("checkpoint.dir = '" + dir.path() +
                     "' is in use by another run (host n1, "
                     "pid 4242, started 2026-05-03 03:09:37 UTC ("),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("SLURM job 77 (restart 0)"), std::string::npos) << m;
    EXPECT_NE(m.find("(lock file " + dir.file("trainer.lock") + ")"), std::string::npos) << m;
  }
}

TEST(RunLock, AReleasedLockIsEmptiedAndTakenWithoutANote) {
  test::TempDir dir;
  { const auto first = RunLock::take(dir_place(dir), holder("n1", 4242), fast(0s)); }
  EXPECT_EQ(read_file(dir.file("trainer.lock")), "");  // a clean end leaves no record
  const auto second = RunLock::take(dir_place(dir), holder("n2", 99), fast(0s));
  EXPECT_TRUE(second->notes().empty());
}

TEST(RunLock, ALockLeftByAKilledRunDoesNotBlock) {
  test::TempDir dir;
  const std::string file = dir.file("trainer.lock");
  Holder killed(file, holder("n1", 4242).to_json(), /*hold_ms=*/0, SIGKILL);
  killed.wait();  // kill -9: the kernel released the lock; its record stays in the file
  ASSERT_NE(read_file(file), "");
  const auto lock = RunLock::take(dir_place(dir), holder("n2", 99), fast(0s));
  ASSERT_EQ(lock->notes().size(), 1u);
  EXPECT_NE(lock->notes()[0].find("the run that held it last (host n1, pid 4242, started "),
            std::string::npos)
      << lock->notes()[0];
  EXPECT_NE(lock->notes()[0].find("ended without a clean exit"), std::string::npos);
  EXPECT_EQ(LockHolder::parse(read_file(file))->pid, 99);
}

TEST(RunLock, WaitsForAnEarlierRunOfItsSlurmJob) {
  test::TempDir dir;
  // A requeued job (restart 1) finds its restart 0 still being torn down for 300 ms.
  Holder torn_down(dir.file("trainer.lock"), holder("n1", 4242, "77").to_json(), 300, SIGKILL);
  LockHolder me = holder("n2", 99, "77");
  me.slurm_restart = "1";
  const auto start = Clock::now();
  const auto lock = RunLock::take(dir_place(dir), me, fast(30s));
  EXPECT_GE(Clock::now() - start, 200ms);
  ASSERT_FALSE(lock->notes().empty());
  EXPECT_NE(lock->notes().back().find("the earlier run of this SLURM job ended after"),
            std::string::npos);
}

TEST(RunLock, RefusesAnEarlierRunOfItsSlurmJobThatOutlivesTheWait) {
  test::TempDir dir;
  Holder alive(dir.file("trainer.lock"), holder("n1", 4242, "77").to_json(), 60000, 0);
  const auto start = Clock::now();
  try {
    RunLock::take(dir_place(dir), holder("n2", 99, "77"), fast(300ms));
    FAIL() << "a live holder of the same SLURM job was not refused after the wait";
  } catch (const OutputsInUse& e) {
    EXPECT_GE(Clock::now() - start, 300ms);
    EXPECT_NE(std::string(e.what()).find("is still held by another run of this SLURM job (host "
                                         "n1, pid 4242, "),
              std::string::npos)
        << e.what();
  }
}

TEST(RunLock, DoesNotWaitForAnotherJob) {
  test::TempDir dir;
  Holder alive(dir.file("trainer.lock"), holder("n1", 4242, "78").to_json(), 60000, 0);
  const auto start = Clock::now();
  EXPECT_THROW(RunLock::take(dir_place(dir), holder("n2", 99, "77"), fast(30s)), OutputsInUse);
  EXPECT_LT(Clock::now() - start, 5s);  // refused at once, not after the same-job wait
}

TEST(RunLock, TakesEveryPlaceOrNone) {
  test::TempDir dir;
  const std::string metrics = dir.file("metrics-elsewhere.jsonl");
  const auto places = output_places(dir.file("ckpt"), metrics, "");
  ASSERT_EQ(places.size(), 2u);
  ASSERT_EQ(::mkdir(dir.file("ckpt").c_str(), 0755), 0);
  // Another run holds the metrics file only.
  const auto other = RunLock::take(output_places("", metrics, ""), holder("n1", 4242), fast(0s));
  try {
    RunLock::take(places, holder("n2", 99), fast(0s));
    FAIL() << "not refused";
  } catch (const OutputsInUse& e) {
    EXPECT_NE(std::string(e.what()).find("log.metrics = '" + metrics + "' is in use"),
              std::string::npos)
        << e.what();
  }
  // The checkpoint.dir it took before it met the metrics file's lock is free again.
  EXPECT_NO_THROW(
      RunLock::take(output_places(dir.file("ckpt"), "", ""), holder("n3", 7), fast(0s)));
}

TEST(OutputPlaces, WhatLiesInsideTheCheckpointDirNeedsNoLockOfItsOwn) {
  const auto inside = output_places("runs/x/", "runs/x/metrics.jsonl", "runs/x/tb");
  ASSERT_EQ(inside.size(), 1u);
  EXPECT_EQ(inside[0].key, "checkpoint.dir");
  EXPECT_EQ(inside[0].lock_file, "runs/x/trainer.lock");
  const auto outside = output_places("runs/x", "runs/xy/metrics.jsonl", "tb");
  ASSERT_EQ(outside.size(), 3u);
  EXPECT_EQ(outside[0].key, "checkpoint.dir");  // by lock file's path: runs/x/ < runs/xy/ < tb/
  EXPECT_EQ(outside[1].lock_file, "runs/xy/metrics.jsonl.lock");
  EXPECT_EQ(outside[2].lock_file, "tb/trainer.lock");
  EXPECT_TRUE(output_places("", "", "").empty());
}

TEST(LockHolder, RecordRoundTripsAndGarbageIsNone) {
  const LockHolder h = holder("n1", 4242, "77");
  const auto back = LockHolder::parse(h.to_json());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->describe(1777777777 + 150),
            "host n1, pid 4242, started 2026-05-03 03:09:37 UTC (2 min ago), SLURM job 77 "
            "(restart 0)");
  EXPECT_TRUE(back->same_slurm_job(h));
  EXPECT_FALSE(holder("n1", 1).same_slurm_job(holder("n1", 1)));  // outside SLURM: never
  EXPECT_FALSE(LockHolder::parse("").has_value());
  EXPECT_FALSE(LockHolder::parse("{\"host\": \"n1\", \"pi").has_value());  // cut short
}

}  // namespace TRAINER_UNITY_ID
}  // namespace launcher
