#include "launcher/failure_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include <unistd.h>

#include "checkpoint/files.h"
#include "ddp/desync.h"
#include "ddp/errors.h"
#include "ddp/gather.h"

namespace launcher {
namespace {

struct Armed {
  bool armed = false;
  int rank = 0;
  std::string dir;
  std::vector<std::string> hosts;  // by rank
};
Armed g_armed;

}  // namespace

void arm_failure_file(ddp::Communicator& control, int rank, const std::string& hostname,
                      const std::string& checkpoint_dir) {
  g_armed.hosts = ddp::all_gather_strings(control, hostname);
  g_armed.rank = rank;
  g_armed.dir = checkpoint_dir;
  g_armed.armed = true;
  // What writers killed by another rank's abort left (nothing of this run writes before it ends).
  if (rank == 0 && !checkpoint_dir.empty()) {
    for (const std::string& name : checkpoint::files_in(checkpoint_dir)) {
      if (name.starts_with("failure.json.") && name.ends_with(".tmp")) {
        ::unlink((checkpoint_dir + "/" + name).c_str());
      }
    }
  }
}

std::string write_failure_file(const std::exception& e, int exit_code) noexcept {
  try {
    if (!g_armed.armed || g_armed.dir.empty()) return {};
    if (dynamic_cast<const ddp::CommTimeout*>(&e) == nullptr) return {};
    const ddp::desync::ExchangeOutcome outcome = ddp::desync::last_exchange();
    // Every rank that took part writes its own finding, not only the lowest: a rank whose
    // exchange ends first aborts the job, and with it the others, before they write.
    if (!outcome.ran || outcome.silent.empty()) return {};
    std::vector<std::string> lost_hosts;
    for (const int r : outcome.silent) {
      const std::string& h = r < static_cast<int>(g_armed.hosts.size()) ? g_armed.hosts[r] : "?";
      if (std::find(lost_hosts.begin(), lost_hosts.end(), h) == lost_hosts.end()) {
        lost_hosts.push_back(h);
      }
    }
    const nlohmann::json record = {
        {"reason", "collective timeout: rank(s) did not answer the desync exchange"},
        {"step", outcome.step},
        {"lost_ranks", outcome.silent},
        {"lost_hosts", lost_hosts},
        {"hosts", g_armed.hosts},
        {"world_size", g_armed.hosts.size()},
        {"written_by_rank", g_armed.rank},
        {"exit_code", exit_code},
        {"message", e.what()},
    };
    const std::string path = g_armed.dir + "/failure.json";
    // "failure.json.R.tmp": one left by a rank killed while writing is removed by the next run.
    const std::string tmp = path + fmt::format(".{}.tmp", g_armed.rank);
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << record.dump() << '\n';
      if (!out.flush()) return {};
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return {};
    spdlog::error("lost rank(s) {} on node(s) {}: written to {}", fmt::join(outcome.silent, ","),
                  fmt::join(lost_hosts, ","), path);
    return path;
  } catch (...) {
    return {};
  }
}

}  // namespace launcher
