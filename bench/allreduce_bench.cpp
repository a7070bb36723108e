// allreduce_bench: raw blocking MPI_Allreduce vs ddp::MpiCommunicator::all_reduce on float32 SUM.
//
//   mpirun -np 2 build/bench/allreduce_bench [--min-s 0.3] [--max-s 1.0] [--samples 5]
//       [--min-iters 2] [--max-mb 256] [--iwait]
//
// For each size (4 KB .. 256 MB, x4 steps) it times (A) MPI_Allreduce(MPI_IN_PLACE, ...) on a
// plain buffer over MPI_COMM_WORLD and (B) the communicator's blocking all_reduce (which posts
// MPI_Iallreduce on its own duplicate of MPI_COMM_WORLD and polls MpiWork::wait) on an at::Tensor
// of the same bytes. Samples alternate A B A B ... so drift (other load, frequency) hits both
// alike; each sample is `iters` back-to-back operations, with `iters` calibrated so a sample takes
// about --min-s seconds. A sample's time is the slowest rank's; the table shows the median
// sample's per-operation time. Before timing, each size is verified once on both paths against
// the closed form of the sum over ranks, so a broken reduce cannot look fast.
// --iwait adds (C), MPI_Iallreduce + MPI_Wait on the plain buffer: the collective the
// communicator posts without its polling loop, to tell the two causes of a gap apart.
#include <mpi.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_util.h"

#include "ddp/communicator.h"
#include "ddp/mpi_runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  double min_s = 0.3;    // target seconds per sample (small sizes); large ones run >= min_iters
  double max_s = 1.0;    // cap on seconds per sample
  int samples = 5;       // samples per variant and size (alternated A B A B ...)
  int min_iters = 2;     // operations per sample, at least
  int64_t max_mb = 256;  // largest size, MiB
  bool iwait = false;    // also time MPI_Iallreduce + MPI_Wait (diagnosis: algorithm vs polling)
};

// Prints help and exits for --help; throws std::invalid_argument for a bad argument.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"All-reduce time of MpiCommunicator against raw MPI_Allreduce, 4 KB to --max-mb"};
  app.add_option("--min-s", a.min_s, "seconds per sample, at least");
  app.add_option("--max-s", a.max_s, "seconds per sample, at most");
  app.add_option("--samples", a.samples, "samples per variant and size")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-iters", a.min_iters, "operations per sample, at least")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-mb", a.max_mb, "largest size in MiB")->check(CLI::PositiveNumber);
  app.add_flag("--iwait", a.iwait, "also time MPI_Iallreduce + MPI_Wait");
  bench::parse_or_exit(app, argc, argv);
  return a;
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} failed: MPI error {}", what, rc));
}

// Seconds of the slowest rank.
double max_over_ranks(double seconds) {
  double out = 0;
  check_mpi(MPI_Allreduce(&seconds, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "max");
  return out;
}

std::string human_bytes(int64_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{} MB", bytes >> 20);
  return fmt::format("{} KB", bytes >> 10);
}

std::string human_time(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

// Input element i on rank r: r + (i % 7); the SUM over W ranks is W(W-1)/2 + W * (i % 7),
// exact in float32.
void fill_pattern(float* p, int64_t n, int rank) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(rank + (i % 7));
}

// Elements that differ from the closed form, on this rank.
int64_t count_wrong(const float* p, int64_t n, int world) {
  int64_t wrong = 0;
  const double base = world * (world - 1) / 2.0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<float>(base + world * (i % 7))) ++wrong;
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  ddp::MpiRuntime mpi(&argc, &argv);
  const int rank = mpi.topology().rank;
  const int world = mpi.topology().world_size;
  try {
    const Args args = parse_args(argc, argv);
    auto comm = mpi.world(std::chrono::seconds(600));
    at::set_num_threads(1);

    std::vector<int64_t> sizes;
    for (int64_t b = 4 << 10; b <= (args.max_mb << 20); b *= 4) sizes.push_back(b);

    struct Row {
      int64_t bytes;
      int iters;
      double raw_s;
      double comm_s;
      double iwait_s;
    };
    std::vector<Row> rows;
    bool all_correct = true;

    for (const int64_t bytes : sizes) {
      const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
      std::vector<float> raw(static_cast<size_t>(n));
      at::Tensor tensor = at::empty({n}, at::kFloat);

      // Verification (and first warm-up) on both paths.
      fill_pattern(raw.data(), n, rank);
      fill_pattern(tensor.data_ptr<float>(), n, rank);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD),
                "MPI_Allreduce");
      comm->all_reduce(tensor, ddp::ReduceOp::kSum, "bench");
      int64_t wrong[2] = {count_wrong(raw.data(), n, world),
                          count_wrong(tensor.data_ptr<float>(), n, world)};
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, wrong, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
                "verify");
      if (wrong[0] != 0 || wrong[1] != 0) {
        all_correct = false;
        if (rank == 0) {
          fmt::print(stderr, "WRONG RESULT at {}: raw {} / comm {} elements differ (over ranks)\n",
                     human_bytes(bytes), wrong[0], wrong[1]);
        }
      }

      // Timing runs on zeros: repeated in-place sums of zeros stay zero (no overflow to inf,
      // no denormals), and MPI's SUM does not depend on the values.
      std::fill(raw.begin(), raw.end(), 0.0f);
      tensor.zero_();
      auto run_raw = [&](int iters) {
        for (int k = 0; k < iters; ++k) {
          MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        }
      };
      auto run_comm = [&](int iters) {
        for (int k = 0; k < iters; ++k) comm->all_reduce(tensor, ddp::ReduceOp::kSum, "bench");
      };
      // Diagnosis only: the non-blocking collective the communicator posts, on the same
      // communicator as (A), completed by MPI_Wait instead of MpiWork's MPI_Test polling.
      auto run_iwait = [&](int iters) {
        for (int k = 0; k < iters; ++k) {
          MPI_Request req = MPI_REQUEST_NULL;
          MPI_Iallreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &req);
          MPI_Wait(&req, MPI_STATUS_IGNORE);
        }
      };
      auto timed = [&](auto&& body, int iters) {
        check_mpi(MPI_Barrier(MPI_COMM_WORLD), "barrier");
        const auto t0 = Clock::now();
        body(iters);
        return max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count());
      };

      // Warm-up and calibration: one op of each, then enough to estimate the per-op time.
      run_raw(1);
      run_comm(1);
      if (args.iwait) run_iwait(1);
      int probe = 1;
      double per_op = 0;
      for (;;) {
        const double t = timed(run_raw, probe) + timed(run_comm, probe);
        per_op = t / (2.0 * probe);
        if (t >= 0.05 || probe >= 1 << 16) break;
        probe *= 4;
      }
      // Same decision on every rank (per_op is already the max over ranks).
      int iters = static_cast<int>(std::clamp(args.min_s / per_op, 1.0, 1e7));
      iters = std::max(iters, args.min_iters);
      if (iters * per_op > args.max_s)
        iters = std::max(args.min_iters, static_cast<int>(args.max_s / per_op));

      std::vector<double> raw_t;
      std::vector<double> comm_t;
      std::vector<double> iwait_t;
      for (int s = 0; s < args.samples; ++s) {
        raw_t.push_back(timed(run_raw, iters) / iters);
        comm_t.push_back(timed(run_comm, iters) / iters);
        if (args.iwait) iwait_t.push_back(timed(run_iwait, iters) / iters);
      }
      rows.push_back({bytes, iters, bench::median(raw_t), bench::median(comm_t),
                      args.iwait ? bench::median(iwait_t) : 0.0});
      if (rank == 0) {
        fmt::print(stderr, "{:>7}: {} samples x {} ops; raw {} comm {}\n", human_bytes(bytes),
                   args.samples, iters, human_time(rows.back().raw_s),
                   human_time(rows.back().comm_s));
      }
    }

    if (rank == 0) {
      const double bus = 2.0 * (world - 1) / world;
      fmt::print("\nall_reduce float32 SUM, {} ranks; median of {} alternating samples per cell; "
                 "results verified: {}\n\n",
                 world, args.samples, all_correct ? "yes" : "NO (see errors above)");
      fmt::print(
          "| size | ops/sample | MPI_Allreduce | busbw (GB/s) | MpiCommunicator | busbw (GB/s) "
          "| raw/comm |{}\n",
          args.iwait ? " MPI_Iallreduce+MPI_Wait | busbw (GB/s) |" : "");
      fmt::print("|---:|---:|---:|---:|---:|---:|---:|{}\n", args.iwait ? "---:|---:|" : "");
      for (const auto& r : rows) {
        fmt::print("| {} | {} | {} | {:.2f} | {} | {:.2f} | {:.2f} |", human_bytes(r.bytes),
                   r.iters, human_time(r.raw_s), bus * r.bytes / r.raw_s / 1e9,
                   human_time(r.comm_s), bus * r.bytes / r.comm_s / 1e9, r.raw_s / r.comm_s);
        if (args.iwait) {
          fmt::print(" {} | {:.2f} |", human_time(r.iwait_s), bus * r.bytes / r.iwait_s / 1e9);
        }
        fmt::print("\n");
      }
    }
    return all_correct ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: {}\n", rank, e.what());
    ddp::MpiRuntime::abort(2);
  }
}
