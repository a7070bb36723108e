// GPU tier: NCCL at world size 1, the Reducer on CUDA tensors, and GPU training against CPU
// training. Every test skips with a reason where no CUDA device is present; on a GPU machine they
// run in full. Run under mpirun -np 1 (MPI is the control plane that bootstraps NCCL).
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>

#include "ddp/errors.h"
#include "ddp/nccl_communicator.h"
#include "ddp/reducer.h"
#include "launcher/config.h"
#include "memory/memory_stats.h"
#include "models/registry.h"
#include "mpi_test_env.h"
#include "train/trainer.h"

namespace {

#define SKIP_WITHOUT_GPU()                                                              \
  do {                                                                                  \
    if (torch::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"; \
    if (!ddp::nccl_available()) GTEST_SKIP() << "this build has no NCCL";               \
  } while (0)

std::unique_ptr<ddp::Communicator> nccl(ddp::Communicator& control) {
  return ddp::make_nccl_communicator(control, 0, std::chrono::seconds(60));
}

TEST(Gpu, NcclAllReduceEveryOpAndDtypeAtWorldOne) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto comm = nccl(*control);
  EXPECT_EQ(comm->backend(), "nccl");
  const int w = comm->size();
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kMax, ddp::ReduceOp::kMin, ddp::ReduceOp::kAvg}) {
      if (op == ddp::ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
      at::Tensor t = at::arange(1000, at::TensorOptions().dtype(at::kLong)).remainder(7).to(dtype).cuda();
      const at::Tensor before = t.clone();
      comm->all_reduce(t, op, "gpu test");
      const at::Tensor expected = op == ddp::ReduceOp::kSum ? before * w : before;
      EXPECT_TRUE(at::equal(t.cpu(), expected.cpu()))
          << c10::toString(dtype) << " " << ddp::to_string(op);
    }
  }
  at::Tensor b = at::full({8}, 3.0, at::TensorOptions().device(at::kCUDA));
  comm->broadcast(b, 0);
  EXPECT_TRUE(at::equal(b.cpu(), at::full({8}, 3.0)));
  at::Tensor out = at::empty({8 * w}, at::TensorOptions().device(at::kCUDA));
  comm->all_gather(out, b);
  EXPECT_TRUE(at::equal(out.cpu(), at::full({8 * w}, 3.0)));
  comm->barrier();
}

TEST(Gpu, NcclRejectsCpuTensorsWithAMessage) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto comm = nccl(*control);
  at::Tensor cpu = at::ones({4});
  EXPECT_THROW(comm->all_reduce(cpu, ddp::ReduceOp::kSum), ddp::CommError);
}

TEST(Gpu, ReducerOnCudaTensorsMatchesPlainBackward) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto comm = nccl(*control);
  torch::nn::Linear a(64, 256), b(256, 10);
  a->to(at::kCUDA);
  b->to(at::kCUDA);
  const at::Tensor x = at::randn({32, 64}, at::TensorOptions().device(at::kCUDA));
  auto loss = [&] { return b(at::relu(a(x))).pow(2).mean(); };
  loss().backward();
  const at::Tensor expected = a->weight.grad().clone() * comm->size();
  a->weight.mutable_grad() = at::Tensor();
  b->weight.mutable_grad() = at::Tensor();
  a->bias.mutable_grad() = at::Tensor();
  b->bias.mutable_grad() = at::Tensor();
  ddp::Reducer reducer({{"a.weight", a->weight}, {"a.bias", a->bias}, {"b.weight", b->weight}, {"b.bias", b->bias}},
                       *comm, {4096, 65536, false}, control.get());
  EXPECT_GE(reducer.layout().size(), 2u);
  reducer.zero_grad();
  reducer.begin_micro_batch(true);
  loss().backward();
  reducer.finish();
  EXPECT_TRUE(at::allclose(a->weight.grad(), expected, 1e-5, 1e-6));
  EXPECT_EQ(reducer.launched_during_backward(), reducer.layout().size());
}

std::vector<at::Tensor> train(const std::string& device, ddp::Communicator& control,
                              ddp::Communicator& data) {
  const auto config = launcher::parse_config(R"(
model: {name: mlp, hidden_dim: 64, depth: 2}
data: {num_samples: 1024, input_dim: 16, num_classes: 5, teacher_hidden: 16, seed: 3}
train: {global_batch_size: 32, micro_batch_size: 8, steps: 20, lr: 0.01, warmup_steps: 2, seed: 5}
)", "gpu.yaml", {"train.device=" + device});
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, train::model_shape_for(*dataset));
  const c10::Device dev = device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  train::Trainer trainer(config.trainer_options(), control, data, model, *dataset, dev);
  for (int64_t s = 0; s < config.train.steps; ++s) trainer.step(s);
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

TEST(Gpu, TrainingOnGpuMatchesCpuWithinFp32Tolerance) {
  SKIP_WITHOUT_GPU();
  // TF32 would make GPU matmuls differ from CPU by far more than fp32 rounding.
  at::globalContext().setAllowTF32CuBLAS(false);
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto gpu_comm = nccl(*control);
  const auto on_gpu = train("cuda", *control, *gpu_comm);
  const auto on_cpu = train("cpu", *control, *control);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < on_gpu.size(); ++i) {
    diff += (on_gpu[i] - on_cpu[i]).pow(2).sum().item<double>();
    norm += on_cpu[i].pow(2).sum().item<double>();
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-4);
}

// A wide MLP whose activations dominate its memory, on the GPU.
std::unique_ptr<train::Trainer> gpu_trainer(ddp::Communicator& control, ddp::Communicator& data,
                                            const std::vector<std::string>& overrides,
                                            std::shared_ptr<models::Model>* model_out,
                                            std::unique_ptr<data::Dataset>* data_out) {
  const auto config = launcher::parse_config(R"(
model: {name: mlp, hidden_dim: 4096, depth: 4}
data: {num_samples: 16384, input_dim: 256, num_classes: 16, teacher_hidden: 64, seed: 3}
train: {device: cuda, global_batch_size: 8192, steps: 6, lr: 0.001, warmup_steps: 1, seed: 5}
)", "gpu-memory.yaml", overrides);
  *data_out = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  *model_out = models::create_model(config.model, train::model_shape_for(**data_out));
  return std::make_unique<train::Trainer>(config.trainer_options(), control, data, *model_out,
                                          **data_out, c10::Device(c10::kCUDA, 0));
}

TEST(Gpu, MemoryEstimateWithinFifteenPercentOfMeasuredPeak) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(120));
  auto comm = nccl(*control);
  std::shared_ptr<models::Model> model;
  std::unique_ptr<data::Dataset> dataset;
  auto trainer = gpu_trainer(*control, *comm, {"train.micro_batch_size=2048"}, &model, &dataset);
  trainer->step(0);
  memory::reset_peaks(c10::Device(c10::kCUDA, 0));
  for (int64_t s = 1; s < 4; ++s) trainer->step(s);
  const double measured = memory::sample_memory(c10::Device(c10::kCUDA, 0)).tensor_peak_bytes;
  const double estimated = trainer->memory_estimate().peak(trainer->plan().micro_batch);
  EXPECT_LT(std::abs(estimated - measured) / measured, 0.15)
      << "estimated " << estimated / 1048576 << " MiB, measured " << measured / 1048576 << " MiB";
}

// A real CUDA OOM: the caching allocator capped (memory.fraction) between what a half and a full
// micro-batch need; the step falls back and the run completes.
TEST(Gpu, MemoryFractionProvokesARealOomThatFallsBack) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(120));
  auto comm = nccl(*control);
  std::shared_ptr<models::Model> model;
  std::unique_ptr<data::Dataset> dataset;
  auto trainer = gpu_trainer(*control, *comm, {"train.micro_batch_size=8192"}, &model, &dataset);
  const auto& e = trainer->memory_estimate();
  const double total = memory::sample_memory(c10::Device(c10::kCUDA, 0)).total_bytes;
  const double between = (e.peak(8192) + e.peak(4096)) / 2.0;
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(between / total, 0);
  for (int64_t s = 0; s < 6; ++s) trainer->step(s);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  EXPECT_GE(trainer->fallbacks(), 1);
  EXPECT_LE(trainer->plan().micro_batch, 4096);
}

}  // namespace
