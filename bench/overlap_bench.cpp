// overlap_bench: what overlapping the gradient all-reduce with backward saves, on CPU over MPI.
//
//   mpirun -np 2 build/bench/overlap_bench [--hidden 1536] [--depth 4] [--batch 16] [--input 512]
//       [--classes 16] [--steps 20] [--warmup 3] [--rounds 3] [--first-mb 1] [--bucket-mb 4]
//       [--threads 1]
//
// Builds three Trainers for the same wide MLP (gradients large next to its compute), each with
// train.threads (default 1) intra-op threads:
//   overlap on   ddp.first_bucket_mb / bucket_mb small: buckets are posted from the
//                post-accumulate-grad hooks while backward still runs;
//   overlap off  first_bucket_mb = bucket_mb = 65536: one bucket, posted when backward ends;
//   no comm      MPI_COMM_SELF (world size 1, same per-rank batch): compute only, both ranks
//                computing at once as in the other two, so the machine is equally loaded.
// Rounds alternate on / off / no comm, `--steps` timed steps each after `--warmup` untimed
// ones per Trainer. A step's time is the slowest rank's; the table shows medians over every
// timed step of every round.
#include <mpi.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_util.h"

#include "config/config.h"
#include "data/registry.h"
#include "ddp/communicator.h"
#include "ddp/mpi_runtime.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  // 1536 x 4: 7.9 M parameters, 30 MiB of gradients (kept under glibc's 32 MiB mmap threshold,
  // above which every MPI temporary buffer is mapped and unmapped per operation).
  int64_t hidden = 1536;
  int64_t depth = 4;
  int64_t batch = 16;  // per rank
  int64_t input = 512;
  int64_t classes = 16;
  int64_t steps = 20;  // timed steps per round and setting
  int64_t warmup = 3;  // untimed steps per setting, before the first round
  int64_t rounds = 3;
  double first_mb = 1;
  double bucket_mb = 4;
  int64_t threads = 1;
  std::string progress = "thread";  // ddp.mpi_progress
  int64_t poll_us = 50;
};

// Prints help and exits for --help; throws std::invalid_argument for a bad argument.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"Step time with gradient buckets overlapped with backward vs one bucket at the end"};
  app.add_option("--hidden", a.hidden, "MLP width")->check(CLI::PositiveNumber);
  app.add_option("--depth", a.depth, "MLP hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--input", a.input, "input features")->check(CLI::PositiveNumber);
  app.add_option("--classes", a.classes, "classes")->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "timed steps per round")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", a.rounds, "rounds of on / off / baseline")->check(CLI::PositiveNumber);
  app.add_option("--first-mb", a.first_mb, "overlap on: first bucket cap (MiB)");
  app.add_option("--bucket-mb", a.bucket_mb, "overlap on: bucket cap (MiB)");
  app.add_option("--threads", a.threads, "intra-op threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--progress", a.progress,
                 "thread: a progress thread drives the posted all-reduces "
                 "(ddp/mpi_progress.h); caller: only the training thread's MPI calls do")
      ->check(CLI::IsMember({"thread", "caller"}));
  app.add_option("--poll-us", a.poll_us, "progress thread: microseconds between rounds of MPI_Test")
      ->check(CLI::PositiveNumber);
  bench::parse_or_exit(app, argc, argv);
  return a;
}

std::string config_text(const Args& a, int world, double first_mb, double bucket_mb,
                        int64_t total_steps) {
  return fmt::format(R"(
model: {{name: mlp, hidden_dim: {}, depth: {}}}
data: {{num_samples: 8192, input_dim: {}, num_classes: {}, teacher_hidden: 64, seed: 7}}
train:
  device: cpu
  global_batch_size: {}
  micro_batch_size: auto
  steps: {}
  lr: 0.0001
  warmup_steps: 0
  grad_clip: 1.0
  seed: 11
  threads: {}
ddp: {{timeout_s: 600, first_bucket_mb: {}, bucket_mb: {}}}
log: {{level: warn}}
)",
                     a.hidden, a.depth, a.input, a.classes, a.batch * world, total_steps, a.threads,
                     first_mb, bucket_mb);
}

// One Trainer with everything it borrows.
struct Setup {
  std::string name;
  config::Config config;
  std::unique_ptr<data::Dataset> dataset;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<train::Trainer> trainer;
  int64_t next_step = 0;
  std::vector<double> step_s;  // timed steps, slowest rank's time

  Setup(std::string n, const std::string& yaml, ddp::Communicator& comm) : name(std::move(n)) {
    config = config::parse_config(yaml, "overlap_bench.yaml");
    dataset = data::make_dataset(config.data);
    at::manual_seed(config.train.seed);
    const core::Shape shape = dataset->shape();
    model = models::create_model(config.model, shape);
    trainer = std::make_unique<train::Trainer>(config.trainer_options(), comm, comm, model,
                                               *dataset, c10::Device(c10::kCPU));
  }

  void steps(int64_t n, bool timed) {
    for (int64_t i = 0; i < n; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      trainer->step(next_step++);
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (timed) step_s.push_back(s);
    }
  }
};

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  ddp::MpiRuntime mpi(&argc, &argv);
  const int rank = mpi.topology().rank;
  try {
    const Args a = parse_args(argc, argv);
    at::set_num_threads(static_cast<int>(a.threads));
    const auto timeout = std::chrono::seconds(600);
    if (a.progress == "thread" &&
        !mpi.start_progress_thread(std::chrono::microseconds(a.poll_us))) {
      throw std::invalid_argument("--progress thread: MPI did not provide MPI_THREAD_MULTIPLE");
    }
    auto world = mpi.world(timeout);
    auto self = mpi.self(timeout);
    const int w = world->size();
    const int64_t total = a.warmup + a.rounds * a.steps + 1;

    Setup on("overlap on", config_text(a, w, a.first_mb, a.bucket_mb, total), *world);
    Setup off("overlap off", config_text(a, w, 65536, 65536, total), *world);
    Setup none("no comm (MPI_COMM_SELF)", config_text(a, 1, 65536, 65536, total), *self);
    std::vector<Setup*> all = {&on, &off, &none};

    int64_t n_params = 0;
    for (const auto& p : on.model->parameters()) n_params += p.numel();
    if (rank == 0) {
      fmt::print(stderr,
                 "mlp hidden {} depth {} input {} classes {}: {} parameters ({:.1f} MiB of "
                 "gradients); {} ranks x batch {}; {} thread(s) per rank\n",
                 a.hidden, a.depth, a.input, a.classes, n_params, n_params * 4 / 1048576.0, w,
                 a.batch, a.threads);
    }

    for (auto* s : all) s->steps(a.warmup, /*timed=*/false);
    for (int64_t r = 0; r < a.rounds; ++r) {
      for (auto* s : all) {
        s->steps(a.steps, /*timed=*/true);
        if (rank == 0) {
          fmt::print(
              stderr, "round {} {}: median {:.1f} ms\n", r + 1, s->name,
              bench::median(std::vector<double>(s->step_s.end() - a.steps, s->step_s.end())) * 1e3);
        }
      }
    }

    if (rank == 0) {
      const double t_on = bench::median(on.step_s);
      const double t_off = bench::median(off.step_s);
      const double t_none = bench::median(none.step_s);
      fmt::print("\noverlap_bench: mlp hidden {} depth {} input {} ({} params, {:.1f} MiB "
                 "gradients), {} ranks x batch {}, {} thread(s)/rank; {} rounds x {} steps, "
                 "medians\n\n",
                 a.hidden, a.depth, a.input, n_params, n_params * 4 / 1048576.0, w, a.batch,
                 a.threads, a.rounds, a.steps);
      fmt::print("| setting | buckets | posted from backward hooks | median step | min step | "
                 "vs no comm |\n");
      fmt::print("|---|---:|---:|---:|---:|---:|\n");
      for (auto* s : all) {
        const auto& red = s->trainer->reducer();
        const double t = bench::median(s->step_s);
        fmt::print("| {} | {} | {} | {:.1f} ms | {:.1f} ms | {:+.1f} ms |\n", s->name,
                   red.layout().size(), red.launched_during_backward(), t * 1e3,
                   min_of(s->step_s) * 1e3, (t - t_none) * 1e3);
      }
      fmt::print("\nbuckets: overlap on: first {} MiB, then {} MiB caps; overlap off: one bucket, "
                 "posted by the last gradient's hook, i.e. as backward ends\n",
                 a.first_mb, a.bucket_mb);
      fmt::print("communication cost without overlap (off - no comm): {:.1f} ms = {:.0f}% of "
                 "the step\n",
                 (t_off - t_none) * 1e3, 100.0 * (t_off - t_none) / t_off);
      fmt::print("overlap saves (off - on) / off: {:.1f} ms = {:.1f}% of the step; hides {:.0f}% "
                 "of the communication cost\n",
                 (t_off - t_on) * 1e3, 100.0 * (t_off - t_on) / t_off,
                 t_off > t_none ? 100.0 * (t_off - t_on) / (t_off - t_none) : 0.0);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: {}\n", rank, e.what());
    ddp::MpiRuntime::abort(2);
  }
}
