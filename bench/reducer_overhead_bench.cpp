// reducer_overhead_bench: what the data-parallel machinery costs where it has nothing to do, at
// world size 1 (issue 3's goal: at most 3% on a GPU).
//
//   mpirun -np 1 build/bench/reducer_overhead_bench [--device cpu|cuda] [--hidden 2048]
//       [--depth 4] [--batch 512] [--input 1024] [--steps 30] [--warmup 10] [--rounds 5]
//       [--threads 2]
//
// Two loops over the same MLP, the same batches and the same optimizer (FusedAdamW):
//   trainer  train::Trainer::step: gradients as views into flat buckets, post-accumulate-grad
//            hooks, the Reducer (at world size 1 it posts no all-reduce: a bucket is its own
//            sum; the data communicator is still NCCL on cuda, MPI on cpu), the status vote (one
//            SUM all-reduce of two host values, stop and failed, on MPI: it carries no loss and
//            waits for no device), the gradient norm over the buckets; nothing is read from the
//            device (read_metrics off, as on steps that are not logged);
//   plain    what a one-device script does: zero the gradients, forward, backward, the
//            gradient norm, the optimizer step.
// Rounds alternate trainer / plain; the bench synchronises the device before and after every
// step of both loops, so each is timed to completion. The table gives the median step of each and
// their ratio.
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

#if TRAINER_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "config/config.h"
#include "data/registry.h"
#include "ddp/backend.h"
#include "ddp/mpi_runtime.h"
#include "ddp/nccl_communicator.h"
#include "ddp/rank_sampler.h"
#include "models/registry.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cpu";
  int64_t hidden = 2048;
  int64_t depth = 4;
  int64_t batch = 512;
  int64_t input = 1024;
  int64_t steps = 30;  // timed steps per round and loop
  int64_t warmup = 10;
  int64_t rounds = 5;
  int64_t threads = 2;
};

Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Step time of the Trainer (reducer, buckets, hooks, vote) vs a plain loop, world size 1"};
  app.add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--hidden", a.hidden, "MLP width")->check(CLI::PositiveNumber);
  app.add_option("--depth", a.depth, "MLP hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--input", a.input, "input features")->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "timed steps per round")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", a.rounds, "rounds of trainer / plain")->check(CLI::PositiveNumber);
  app.add_option("--threads", a.threads, "intra-op threads (cpu)")->check(CLI::PositiveNumber);
  bench::parse_or_exit(app, argc, argv);
  return a;
}

void synchronize(c10::Device device) {
#if TRAINER_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

// The same model, data and optimizer as the Trainer's, without any of its machinery.
struct PlainLoop {
  std::shared_ptr<models::Model> model;
  const data::Dataset& dataset;
  ddp::RankSampler sampler;
  c10::Device device;
  int64_t batch;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;
  std::unique_ptr<train::FusedAdamW> optimizer;
  std::unique_ptr<train::GradClipper> clipper;

  PlainLoop(std::shared_ptr<models::Model> m, const data::Dataset& d, c10::Device dev, int64_t b,
            const config::Config& c)
      : model(std::move(m)), dataset(d), sampler(d.size(), b, c.train.seed), device(dev), batch(b) {
    model->to(device);
    params = model->parameters();
    for (auto& p : params) {
      p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad().view({-1}));
    }
    optimizer = std::make_unique<train::FusedAdamW>(
        params, train::AdamWHyper{c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay});
    clipper = std::make_unique<train::GradClipper>(grads);
  }

  void step(int64_t s, double lr, double clip) {
    for (auto& g : grads) g.zero_();
    const data::Batch b = dataset.get(sampler.indices(s, 0, batch));
    const auto inputs = b.inputs.to(device, /*non_blocking=*/true);
    const auto targets = b.targets.to(device, /*non_blocking=*/true);
    model->loss(inputs, targets).backward();
    clipper->clip(clip);
    optimizer->step(lr);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ddp::MpiRuntime mpi(&argc, &argv);
  try {
    const Args a = parse_args(argc, argv);
    at::set_num_threads(static_cast<int>(a.threads));
    const c10::Device device =
        a.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    const int64_t total = a.warmup + a.rounds * a.steps + 1;
    const auto config = config::parse_config(
        fmt::format(R"(
model: {{name: mlp, hidden_dim: {}, depth: {}}}
data: {{num_samples: {}, input_dim: {}, num_classes: 16, teacher_hidden: 64, seed: 7}}
train: {{device: {}, global_batch_size: {}, micro_batch_size: {}, steps: {}, lr: 0.0001,
         warmup_steps: 0, grad_clip: 1.0, seed: 11}}
ddp: {{timeout_s: 600}}
log: {{level: warn}}
)",
                    a.hidden, a.depth, 4 * a.batch, a.input, a.device, a.batch, a.batch, total),
        "bench.yaml");
    const auto dataset = data::make_dataset(config.data);
    const core::Shape shape = dataset->shape();

    auto control = mpi.self(std::chrono::seconds(600));
    const std::string backend = ddp::resolve_backend("auto", device, ddp::nccl_available());
    auto data_comm =
        ddp::make_data_communicator(backend, device, *control, std::chrono::seconds(600));
    at::manual_seed(config.train.seed);
    auto trainer_model = models::create_model(config.model, shape);
    train::Trainer trainer(config.trainer_options(), *control, *data_comm, trainer_model, *dataset,
                           device);
    at::manual_seed(config.train.seed);
    PlainLoop plain(models::create_model(config.model, shape), *dataset, device, a.batch, config);

    int64_t n_params = 0;
    for (const auto& p : plain.params) n_params += p.numel();
    std::vector<double> t_trainer, t_plain;
    int64_t next_trainer = 1, next_plain = 1;  // steps count from 1 (Trainer::step)
    auto run = [&](bool use_trainer, int64_t n, std::vector<double>* times) {
      for (int64_t i = 0; i < n; ++i) {
        synchronize(device);
        const auto t0 = Clock::now();
        if (use_trainer) {
          // As in training between log lines: nothing read from the device (the plain loop reads
          // nothing either).
          trainer.step(next_trainer++, /*stop_requested=*/false, /*read_metrics=*/false);
        } else {
          plain.step(next_plain++, config.train.lr, config.train.grad_clip);
        }
        synchronize(device);
        if (times) times->push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    };
    run(true, a.warmup, nullptr);
    run(false, a.warmup, nullptr);
    for (int64_t r = 0; r < a.rounds; ++r) {
      run(true, a.steps, &t_trainer);
      run(false, a.steps, &t_plain);
      fmt::print(
          stderr, "round {}: trainer {:.3f} ms, plain {:.3f} ms\n", r + 1,
          bench::median(std::vector<double>(t_trainer.end() - a.steps, t_trainer.end())) * 1e3,
          bench::median(std::vector<double>(t_plain.end() - a.steps, t_plain.end())) * 1e3);
    }
    const double mt = bench::median(t_trainer), mp = bench::median(t_plain);
    fmt::print(
        "\nreducer_overhead_bench: {} ({}), mlp hidden {} depth {} input {} ({} params, "
        "{:.1f} MiB of gradients in {} bucket(s)), batch {}, {} rounds x {} steps, medians\n\n",
        a.device, backend, a.hidden, a.depth, a.input, n_params, n_params * 4 / 1048576.0,
        trainer.reducer().layout().size(), a.batch, a.rounds, a.steps);
    fmt::print("| loop | median step | trainer / plain |\n|---|---:|---:|\n");
    fmt::print("| trainer (reducer, {} all-reduce, vote) | {:.3f} ms | {:.3f} |\n", backend,
               mt * 1e3, mt / mp);
    fmt::print("| plain (forward, backward, FusedAdamW) | {:.3f} ms | 1 |\n", mp * 1e3);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "reducer_overhead_bench: error: {}\n", e.what());
    return 1;
  }
}
