// norm_allreduce_bench: the gradient-norm all-reduce of a hybrid-sharded run (ddp.shard_group:
// node) over this node's ranks, where the clipper summed it without the spike guard until the
// clipper summed over the world in every case (ModelState::make_clipper), against the same
// all-reduce over the world: 1 + 1 float32 values (the squared norm and the guard's loss rider),
// through ddp::MpiCommunicator, as the step issues it.
//
//   TRAINER_TEST_RANKS_PER_NODE=2 mpirun -np 4 build/bench/norm_allreduce_bench [--samples 9]
//       [--iters 2000]
//
// Samples alternate node, world, node, world ... so that drift (other load) hits both alike; each
// sample is `iters` back-to-back blocking all-reduces, timed from a barrier, and its time is the
// slowest rank's. The table shows the median per operation and the spread of the samples.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_util.h"

#include "ddp/communicator.h"
#include "ddp/mpi_runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per all-reduce of `values` on `comm`, the slowest rank's (a MAX over `world`).
double per_op(ddp::Communicator& comm, ddp::Communicator& world, at::Tensor& values, int iters) {
  world.barrier("sample");
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) comm.all_reduce(values, ddp::ReduceOp::kSum, "gradient norm");
  at::Tensor s =
      at::tensor({std::chrono::duration<double>(Clock::now() - t0).count()}, at::kDouble);
  world.all_reduce(s, ddp::ReduceOp::kMax, "slowest rank");
  return s.item<double>() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  ddp::MpiRuntime mpi(&argc, &argv);
  const auto& topology = mpi.topology();
  try {
    int samples = 9;
    int iters = 2000;
    CLI::App app{"Gradient-norm all-reduce (2 floats) over the node against over the world"};
    app.add_option("--samples", samples, "samples per communicator")->check(CLI::PositiveNumber);
    app.add_option("--iters", iters, "all-reduces per sample")->check(CLI::PositiveNumber);
    bench::parse_or_exit(app, argc, argv);
    at::set_num_threads(1);
    auto world = mpi.world(std::chrono::seconds(600));
    auto node = mpi.node(std::chrono::seconds(600));  // every rank, after world()
    at::Tensor values = at::zeros({2}, at::kFloat);   // zeros: the sums stay finite
    per_op(*node, *world, values, iters);             // warm-up
    per_op(*world, *world, values, iters);
    std::vector<double> on_node, on_world;
    for (int s = 0; s < samples; ++s) {
      on_node.push_back(per_op(*node, *world, values, iters));
      on_world.push_back(per_op(*world, *world, values, iters));
    }
    if (topology.rank == 0) {
      const auto row = [](const char* name, int ranks, const std::vector<double>& t) {
        fmt::print("{:<6} {:>5} {:>12.2f} {:>12.2f} {:>12.2f}\n", name, ranks,
                   bench::median(t) * 1e6, *std::min_element(t.begin(), t.end()) * 1e6,
                   *std::max_element(t.begin(), t.end()) * 1e6);
      };
      fmt::print("{} rank(s), {} node(s) of {}; {} samples of {} all-reduces each\n",
                 topology.world_size, topology.num_nodes, topology.node_size, samples, iters);
      fmt::print("{:<6} {:>5} {:>12} {:>12} {:>12}\n", "over", "ranks", "median us", "min us",
                 "max us");
      row("node", node->size(), on_node);
      row("world", world->size(), on_world);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "norm_allreduce_bench: rank {}: {}\n", topology.rank, e.what());
    ddp::MpiRuntime::abort(1);
  }
}
