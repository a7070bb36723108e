#include "launcher/run_lock.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace launcher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string utc(int64_t t) {
  const std::time_t time = t;
  std::tm tm{};
  ::gmtime_r(&time, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string ago(int64_t seconds) {
  if (seconds < 0) return "in the future: the clocks of the two hosts differ";
  if (seconds < 120) return fmt::format("{} s ago", seconds);
  if (seconds < 7200) return fmt::format("{} min ago", seconds / 60);
  if (seconds < 172800) return fmt::format("{} h {} min ago", seconds / 3600, seconds % 3600 / 60);
  return fmt::format("{} days ago", seconds / 86400);
}

// `p` made absolute and normal, without a trailing separator (lexically: symbolic links are not
// followed, and need not exist).
fs::path normal(const std::string& p) {
  std::error_code ec;
  fs::path out = fs::absolute(p, ec).lexically_normal();
  if (ec) out = fs::path(p).lexically_normal();
  if (out.has_filename() || !out.has_parent_path()) return out;
  return out.parent_path();
}

bool inside(const std::string& path, const std::string& dir) {
  const fs::path p = normal(path), d = normal(dir);
  const auto [in_dir, in_path] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return in_dir == d.end();
}

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, at);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    at += n;
  }
  return text;
}

// The holder's record in a lock another process holds; it may be between taking the lock and
// writing, so an empty or partial record is read again for up to a second.
std::optional<LockHolder> read_holder(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (auto holder = LockHolder::parse(read_all(fd))) return holder;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

// Replaces the lock file's content with `text`, on the disk (or the NFS server) before returning.
void write_record(int fd, const std::string& text, const LockPlace& place) {
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd) != 0) {
    throw LaunchError(fmt::format("{} = '{}': cannot write its lock file {}: {}", place.key,
                                  place.target, place.lock_file, std::strerror(errno)));
  }
}

// flock's answers for a file system that has no locks (Lustre without -o flock, some FUSE).
bool locks_unsupported(int error) {
  return error == ENOLCK || error == EOPNOTSUPP || error == ENOTSUP || error == ENOSYS;
}

std::string env_or_empty(const EnvLookup& env, const char* name) { return env(name).value_or(""); }

std::string seconds(std::chrono::duration<double> d) { return fmt::format("{:.0f} s", d.count()); }

}  // namespace

LockHolder LockHolder::this_process(const std::string& host, const EnvLookup& env) {
  return {host,
          static_cast<int64_t>(::getpid()),
          unix_now(),
          env_or_empty(env, "SLURM_JOB_ID"),
          env_or_empty(env, "SLURM_RESTART_COUNT"),
          env_or_empty(env, "SLURM_CLUSTER_NAME")};
}

std::string LockHolder::to_json() const {
  const nlohmann::json record = {
      {"host", host},
      {"pid", pid},
      {"started", started},
      {"started_utc", utc(started)},
      {"slurm_job_id", slurm_job},
      {"slurm_restart_count", slurm_restart},
      {"slurm_cluster", slurm_cluster},
  };
  return record.dump() + "\n";
}

std::optional<LockHolder> LockHolder::parse(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("host") || !j.contains("pid")) return std::nullopt;
  try {
    return LockHolder{j.at("host").get<std::string>(),
                      j.at("pid").get<int64_t>(),
                      j.value("started", int64_t{0}),
                      j.value("slurm_job_id", std::string()),
                      j.value("slurm_restart_count", std::string()),
                      j.value("slurm_cluster", std::string())};
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string LockHolder::describe(int64_t now) const {
  std::string text =
      fmt::format("host {}, pid {}, started {} ({})", host, pid, utc(started), ago(now - started));
  if (!slurm_job.empty()) {
    text += fmt::format(", SLURM job {}", slurm_job);
    if (!slurm_restart.empty()) text += fmt::format(" (restart {})", slurm_restart);
  }
  return text;
}

bool LockHolder::same_slurm_job(const LockHolder& other) const {
  return !slurm_job.empty() && slurm_job == other.slurm_job && slurm_cluster == other.slurm_cluster;
}

std::vector<LockPlace> output_places(const std::string& checkpoint_dir, const std::string& metrics,
                                     const std::string& tensorboard) {
  std::vector<LockPlace> places;
  const auto outside = [&](const std::string& p) {
    return !p.empty() && (checkpoint_dir.empty() || !inside(p, checkpoint_dir));
  };
  if (!checkpoint_dir.empty()) {
    places.push_back(
        {"checkpoint.dir", checkpoint_dir, (fs::path(checkpoint_dir) / kLockFileName).string()});
  }
  if (outside(metrics)) places.push_back({"log.metrics", metrics, metrics + ".lock"});
  if (outside(tensorboard)) {
    places.push_back(
        {"log.tensorboard", tensorboard, (fs::path(tensorboard) / kLockFileName).string()});
  }
  std::sort(places.begin(), places.end(), [](const LockPlace& a, const LockPlace& b) {
    return normal(a.lock_file) < normal(b.lock_file);
  });
  return places;
}

namespace {

std::string in_use_message(const LockPlace& p, const std::optional<LockHolder>& holder,
                           bool same_job, std::chrono::duration<double> waited) {
  const std::string who =
      holder ? holder->describe(unix_now()) : "its lock file names none yet: it may be starting";
  if (same_job) {
    return fmt::format(
        "{} = '{}' is still held by another run of this SLURM job ({}) after waiting {}: its "
        "processes are still running, or its node died and the file system keeps the lock "
        "(NFSv3 keeps a dead node's locks until it reboots). Make sure that run has ended "
        "(scancel, or the node), then start this one again (lock file {})",
        p.key, p.target, who, seconds(waited), p.lock_file);
  }
  return fmt::format(
      "{} = '{}' is in use by another run ({}): two runs writing there would overwrite each "
      "other's files. Wait for that run to end, stop it, or give this one another {} (lock file "
      "{})",
      p.key, p.target, who, p.key, p.lock_file);
}

}  // namespace

std::unique_ptr<RunLock> RunLock::take(const std::vector<LockPlace>& places, const LockHolder& me,
                                       const Options& options) {
  std::unique_ptr<RunLock> lock(new RunLock());
  const auto start = Clock::now();
  bool said = false;
  for (;;) {
    const std::optional<Busy> busy = lock->try_all(places, me);
    if (!busy) break;
    const bool same_job = busy->holder && busy->holder->same_slurm_job(me);
    const std::chrono::duration<double> waited = Clock::now() - start;
    if (!same_job || waited >= options.same_job_grace) {
      throw OutputsInUse(in_use_message(busy->place, busy->holder, same_job, waited));
    }
    if (!said) {
      said = true;
      spdlog::warn("{} = '{}' is held by another run of this SLURM job ({}); waiting up to {} for "
                   "it to end (a requeued or restarted job whose earlier run is being torn down)",
                   busy->place.key, busy->place.target, busy->holder->describe(unix_now()),
                   seconds(options.same_job_grace));
    }
    std::this_thread::sleep_for(options.poll);
  }
  if (said) {
    lock->notes_.push_back(
        fmt::format("the earlier run of this SLURM job ended after {}: its lock is taken",
                    seconds(Clock::now() - start)));
  }
  return lock;
}

std::optional<RunLock::Busy> RunLock::try_all(const std::vector<LockPlace>& places,
                                              const LockHolder& me) {
  notes_.clear();
  for (const LockPlace& place : places) {
    const int fd = ::open(place.lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int error = errno;
      release();
      throw LaunchError(fmt::format("{} = '{}': cannot open its lock file {}: {}", place.key,
                                    place.target, place.lock_file, std::strerror(error)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (error == EWOULDBLOCK) {
        Busy busy{place, read_holder(fd)};
        ::close(fd);
        release();
        return busy;
      }
      ::close(fd);
      if (locks_unsupported(error)) {
        notes_.push_back(fmt::format(
            "{} = '{}': its file system does not support flock ({}): a second run into it would "
            "not be refused",
            place.key, place.target, std::strerror(error)));
        continue;
      }
      release();
      throw LaunchError(fmt::format("{} = '{}': cannot lock {}: {}", place.key, place.target,
                                    place.lock_file, std::strerror(error)));
    }
    held_.push_back({place, fd});
    // A record in a lock nobody held: its run ended without a clean exit (which empties it).
    if (const auto previous = LockHolder::parse(read_all(fd))) {
      notes_.push_back(fmt::format(
          "{} = '{}': the run that held it last ({}) ended without a clean exit (killed or "
          "aborted); this run takes it over",
          place.key, place.target, previous->describe(unix_now())));
    }
    try {
      write_record(fd, me.to_json(), place);
    } catch (...) {
      release();
      throw;
    }
  }
  return std::nullopt;
}

void RunLock::release() noexcept {
  for (const Held& h : held_) {
    if (::ftruncate(h.fd, 0) != 0) {
      // Left as it is: the next run reports a holder that did not end cleanly. Harmless.
    }
    ::close(h.fd);  // the lock goes with the last descriptor of its open file description
  }
  held_.clear();
}

RunLock::~RunLock() { release(); }

std::vector<std::string> RunLock::files() const {
  std::vector<std::string> out;
  for (const Held& h : held_) out.push_back(h.place.lock_file);
  return out;
}

}  // namespace launcher
