// GPU tier, the training step on CUDA through the Trainer: CUDA graphs (graphed training equals
// eager, a fallback drops the graph and the next step captures anew, dropout under bf16 in a
// graph) and the step without host synchronisation. Every test skips with a reason where no CUDA
// device is present. Run under mpirun -np 1 (MPI is the control plane that bootstraps NCCL).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "data/registry.h"
#include "gpu_test_util.h"
#include "memory/allocator_guard.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using test::nccl;
using test::write_token_shard;

// gpt-tiny from a token shard on CUDA, through the Trainer: `steps` steps, reading the metrics on
// every `read_every`-th step only (as between log lines).
struct GptRun {
  std::vector<at::Tensor> params;
  std::vector<double> losses;  // of the read steps
  int captures = 0;
  int replays = 0;
};

GptRun train_gpt_on_cuda(ddp::Communicator& control, ddp::Communicator& data,
                         const std::string& dir, const std::vector<std::string>& overrides,
                         int64_t steps, int64_t read_every = 1,
                         const std::function<void(int64_t step)>& before_step = nullptr) {
  const std::string yaml = "model: {name: gpt, preset: tiny}\n"
                           "data: {dataset: tokens, path: " +
                           dir +
                           ", context: 32, "
                           "vocab_size: 256, workers: 2, prefetch: 3}\n"
                           "train: {device: cuda, global_batch_size: 16, micro_batch_size: 4, "
                           "steps: 100, lr: 0.003, warmup_steps: 2, seed: 5}\n";
  const auto config = config::parse_config(yaml, "gpu-gpt.yaml", overrides);
  // memory.inject_oom, armed as the launcher arms it (launcher/device.cpp), for this run only.
  memory::CpuAllocatorGuard::instance().set_injections(
      control.rank(), memory::parse_injections(config.memory.inject_oom));
  struct Disarm {
    ~Disarm() { memory::CpuAllocatorGuard::instance().set_injections(0, {}); }
  } disarm;
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  train::Trainer trainer(config.trainer_options(), control, data, model, *dataset,
                         c10::Device(c10::kCUDA, 0));
  GptRun run;
  for (int64_t s = 1; s <= steps; ++s) {
    if (before_step) before_step(s);
    const bool read = s % read_every == 0;
    const auto r = trainer.step(s, /*stop_requested=*/false, read);
    if (read) run.losses.push_back(r.loss);
  }
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu().clone());
  run.captures = trainer_test::graphs(trainer).captures();
  run.replays = trainer_test::graphs(trainer).replays();
  return run;
}

double relative_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]).pow(2).sum().item<double>();
    norm += b[i].pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

// train.cuda_graphs: after 3 eager warm-up steps forward + backward of a micro-batch is captured
// once and replayed for every later micro-batch (4 per step here); the parameters end where eager
// training puts them. An OOM fallback (injected at step 6) drops the graph, the next step
// captures at the halved micro-batch, and the run still matches eager training.
TEST(Gpu, CudaGraphsTrainLikeEagerAndRecaptureAfterAFallback) {
  SKIP_WITHOUT_GPU();
  at::globalContext().setAllowTF32CuBLAS(false);
  auto control = trainer_test::runtime().world(std::chrono::seconds(120));
  auto comm = nccl(*control);
  test::TempDir dir;
  write_token_shard(dir.path());
  const auto eager = train_gpt_on_cuda(*control, *comm, dir.path(), {}, 12);
  const auto graphed =
      train_gpt_on_cuda(*control, *comm, dir.path(), {"train.cuda_graphs=true"}, 12);
  EXPECT_EQ(eager.captures, 0);
  EXPECT_EQ(graphed.captures, 1);
  EXPECT_EQ(graphed.replays, (12 - 3) * 4);
  EXPECT_LT(relative_difference(graphed.params, eager.params), 1e-5);
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-5 * eager.losses[i]) << "step " << i + 1;
  }

  const std::vector<std::string> oom = {"memory.inject_oom=0:6:forward",
                                        "memory.fallback=[halve_micro_batch]"};
  auto with = [](std::vector<std::string> v, const std::string& extra) {
    v.push_back(extra);
    return v;
  };
  const auto eager_oom = train_gpt_on_cuda(*control, *comm, dir.path(), oom, 12);
  const auto graphed_oom =
      train_gpt_on_cuda(*control, *comm, dir.path(), with(oom, "train.cuda_graphs=true"), 12);
  EXPECT_EQ(eager_oom.captures, 0);
  EXPECT_EQ(graphed_oom.captures, 2) << "micro-batch 4, then 2 after the fallback";
  EXPECT_LT(relative_difference(graphed_oom.params, eager_oom.params), 1e-5);
}

// Graph replays draw dropout masks from the registered CUDA generator, reseeded every step:
// two graphed runs with dropout under bf16 autocast are bitwise equal, and they train.
TEST(Gpu, CudaGraphsWithDropoutUnderBf16AreDeterministicAndTrain) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(120));
  auto comm = nccl(*control);
  test::TempDir dir;
  write_token_shard(dir.path());
  const std::vector<std::string> o = {"train.cuda_graphs=true", "model.dropout=0.1",
                                      "train.precision=bf16"};
  const auto a = train_gpt_on_cuda(*control, *comm, dir.path(), o, 40, 1);
  const auto b = train_gpt_on_cuda(*control, *comm, dir.path(), o, 40, 1);
  EXPECT_EQ(a.captures, 1);
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(at::equal(a.params[i], b.params[i])) << i;
  EXPECT_LT(a.losses.back(), 0.8 * a.losses.front());
}

// Note [No host synchronisation in the step], on CUDA: with PyTorch's sync debug mode set to
// error, any synchronising CUDA call (item(), a blocking copy, a stream or device sync) throws.
// Steps that read no metrics make none, eager or replaying a graph (world size 1: nothing is
// reduced, so no NCCL wait either).
TEST(Gpu, StepsThatLogNothingDoNotSynchronise) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(120));
  auto comm = nccl(*control);
  test::TempDir dir;
  write_token_shard(dir.path());
  for (const std::string graphs : {"false", "true"}) {
    // Steps 5.. (past warm-up and the first capture) run under the debug mode; every 4th reads.
    auto before = [](int64_t s) {
      c10::cuda::warning_state().set_sync_debug_mode(s >= 5 && s % 4 != 0
                                                         ? c10::cuda::SyncDebugMode::L_ERROR
                                                         : c10::cuda::SyncDebugMode::L_DISABLED);
    };
    try {
      train_gpt_on_cuda(*control, *comm, dir.path(), {"train.cuda_graphs=" + graphs}, 16, 4,
                        before);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "cuda_graphs " << graphs << ": a step synchronised: " << e.what();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
}

}  // namespace TRAINER_UNITY_ID
