#include "launcher/cpu_binding.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace launcher {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// The CPUs this job may use on the node: the cgroup's effective cpuset (v2, then v1), else the
// online CPUs.
std::vector<int> node_cpus() {
  for (const char* path :
       {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"}) {
    if (auto cpus = parse_cpu_list(read_first_line(path)); !cpus.empty()) return cpus;
  }
  return parse_cpu_list(read_first_line("/sys/devices/system/cpu/online"));
}

std::vector<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    int first = 0, last = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &first, &last) == 2 && first <= last) {
      for (int c = first; c <= last; ++c) cpus.push_back(c);
    } else if (std::sscanf(part.c_str(), "%d", &first) == 1) {
      cpus.push_back(first);
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? fmt::format("{}-{}", cpus[i], cpus[j]) : std::to_string(cpus[i]);
    i = j + 1;
  }
  return out;
}

std::string CpuBinding::describe() const {
  if (!rebound) return "cpus " + format_cpu_list(cpus);
  return fmt::format("cpus {} (the launcher bound it to {}: fewer than its share of the node)",
                     format_cpu_list(cpus), format_cpu_list(launcher));
}

CpuBinding plan_cpu_binding(const std::vector<int>& node, const std::vector<int>& launcher,
                            int local_rank, int local_size, int64_t threads_setting) {
  CpuBinding b;
  b.launcher = launcher;
  b.cpus = launcher;
  size_t share_size = launcher.size();
  if (!node.empty() && local_size >= 1) {
    // Contiguous blocks of the node's CPUs, the first (n % local_size) one CPU larger; more
    // ranks than CPUs: one CPU each, round robin.
    const int n = static_cast<int>(node.size());
    std::vector<int> share;
    if (n <= local_size) {
      share = {node[local_rank % n]};
    } else {
      const int base = n / local_size, extra = n % local_size;
      const int begin = local_rank * base + std::min(local_rank, extra);
      const int size = base + (local_rank < extra ? 1 : 0);
      share.assign(node.begin() + begin, node.begin() + begin + size);
    }
    share_size = share.size();
    if (threads_setting <= 0 && launcher.size() < share.size()) {
      b.cpus = share;
      b.rebound = true;
    }
  }
  // Auto: one thread per core of the share, and no more than the binding allows (ranks that
  // share a wider binding, e.g. more ranks than cores, must not each run a thread per core).
  b.threads = threads_setting > 0
                  ? static_cast<int>(threads_setting)
                  : std::max(1, static_cast<int>(std::min(b.cpus.size(), share_size)));
  return b;
}

CpuBinding bind_cpus(int local_rank, int local_size, int64_t threads_setting) {
  CpuBinding b = plan_cpu_binding(node_cpus(), affinity(), local_rank, local_size, threads_setting);
  if (b.rebound) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : b.cpus) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      throw std::runtime_error(fmt::format(
          "local rank {}: cannot bind to cpus {}: {} (set train.threads to keep the launcher's "
          "binding, cpus {})",
          local_rank, format_cpu_list(b.cpus), std::strerror(errno), format_cpu_list(b.launcher)));
    }
  }
  return b;
}

}  // namespace launcher
