#include "train/report/metrics.h"

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace train {

namespace {

// Writes `text` whole at the end of `fd`; false with errno set when the file system refuses part
// of it.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

std::runtime_error cannot_write(const std::string& path, int err, const char* what) {
  return std::runtime_error(
      fmt::format("log.metrics: cannot write {} ({}): {}", path, what, std::strerror(err)));
}

// The records of `path` to keep (those up to step `keep_through` that parse), and whether that is
// the whole file, each line with its newline.
std::vector<std::string> kept_records(const std::string& path, int64_t keep_through, bool& all) {
  std::vector<std::string> kept;
  all = true;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const bool cut_short = in.eof();  // no newline: a write cut short (rewritten with one)
    // A line that is not JSON (a write cut short by a kill) is dropped with the later records.
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto step = record.is_object() ? record.find("step") : record.end();
    const bool later = record.is_object() && step != record.end() && step->is_number_integer() &&
                       step->get<int64_t>() > keep_through;
    const bool keep = record.is_object() && !later;
    all = all && keep && !cut_short;
    if (keep) kept.push_back(line + '\n');
  }
  return kept;
}

}  // namespace

MetricsFile::MetricsFile(const std::string& path, int64_t keep_through) : path_(path) {
  bool all = true;
  const std::vector<std::string> kept = kept_records(path, keep_through, all);
  if (!all) {  // rewritten beside it and renamed: a failure leaves the file as it was
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw cannot_write(tmp, errno, "dropping the records after the checkpoint");
    bool ok = true;
    for (const auto& line : kept) ok = ok && write_all(fd, line);
    const int err = errno;
    if (::close(fd) != 0 || !ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const int why = ok ? errno : err;
      ::unlink(tmp.c_str());
      throw cannot_write(path, why, "dropping the records after the checkpoint; it is unchanged");
    }
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw cannot_write(path, errno, "opening it");
  size_ = ::lseek(fd_, 0, SEEK_END);
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsFile::MetricsFile(MetricsFile&& other) noexcept { *this = std::move(other); }

MetricsFile& MetricsFile::operator=(MetricsFile&& other) noexcept {
  if (this == &other) return *this;
  if (fd_ >= 0) ::close(fd_);
  path_ = std::move(other.path_);
  fd_ = std::exchange(other.fd_, -1);
  size_ = other.size_;
  dropped_ = other.dropped_;
  failing_ = other.failing_;
  return *this;
}

void MetricsFile::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump() + '\n';
  if (write_all(fd_, line)) {
    size_ += static_cast<int64_t>(line.size());
    if (failing_ > 0) {
      spdlog::info("log.metrics: {} is written again, after {} record(s) dropped", path_, failing_);
    }
    failing_ = 0;
    return;
  }
  const int err = errno;
  // Part of the line may have gone in: cut it off, so the file holds whole records only.
  const bool cut = ::ftruncate(fd_, size_) == 0;
  ++dropped_;
  if (failing_++ == 0 || !cut) {
    spdlog::warn("log.metrics: a record (step {}) could not be written to {}: {}; it is dropped{} "
                 "and training goes on (the next records are tried again)",
                 record.value("step", int64_t{-1}), path_, std::strerror(err),
                 cut ? "" : ", and the part written could not be cut off");
  }
}

void check_metrics_path(const std::string& path) {
  std::ofstream probe(path, std::ios::out | std::ios::app);
  if (!probe) {
    throw std::invalid_argument(
        fmt::format("log.metrics = '{}': cannot write it: {}", path, std::strerror(errno)));
  }
}

std::string metrics_path(const std::string& configured, const std::string& checkpoint_dir) {
  if (configured == "off") return "";
  if (!configured.empty()) return configured;
  return checkpoint_dir.empty() ? "" : checkpoint_dir + "/metrics.jsonl";
}

}  // namespace train
