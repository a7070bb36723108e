// CPU binding: which cores a rank computes on, and with how many threads.
//
// Launchers bind ranks to cores, and not always to as many as a rank should use: Open MPI binds
// each rank to ONE core when it starts two ranks or fewer, so `mpirun -np 1 trainer` on an
// 8-core machine computes with 8 threads on one core (and plain PyTorch scripts under mpirun do
// the same). A rank's share is its block of the node's cores: the CPUs this job may use there
// (the cgroup's cpuset under SLURM or a container; else every online CPU), split into local_size
// contiguous blocks, block local_rank for this rank. When train.threads is auto (0) and the
// launcher left the rank fewer CPUs than its share, the rank binds itself to its share (the
// calling thread, before any compute thread exists, so that they inherit it); with train.threads
// set, or a launcher binding at least as wide as the share, the launcher's binding stands.
// Threads (auto): the CPUs the rank is bound to in the end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace launcher {

struct CpuBinding {
  std::vector<int> cpus;         // the rank's CPUs in the end
  std::vector<int> launcher;     // what the launcher gave (sched_getaffinity at start)
  bool rebound = false;          // the rank widened its binding to its share
  int threads = 1;               // at::set_num_threads
  std::string describe() const;  // "cpus 0-3" or "cpus 0-1 (rebound from 0: ...)"
};

// The decision alone, for tests: `node` are the CPUs the job may use on the node, `launcher` the
// rank's affinity at start.
CpuBinding plan_cpu_binding(const std::vector<int>& node, const std::vector<int>& launcher,
                            int local_rank, int local_size, int64_t threads_setting);

// Reads the node's CPUs and this process's affinity, applies plan_cpu_binding's decision
// (sched_setaffinity) and returns it. Throws std::runtime_error naming the CPUs if binding fails.
CpuBinding bind_cpus(int local_rank, int local_size, int64_t threads_setting);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11} (the kernel's cpulist format).
std::vector<int> parse_cpu_list(const std::string& text);
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace launcher
