// GPU tier: NCCL at world size 1, the Reducer on CUDA tensors, and GPU training against CPU
// training. Every test skips with a reason where no CUDA device is present; on a GPU machine they
// run in full. Run under mpirun -np 1 (MPI is the control plane that bootstraps NCCL).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>

#include "ddp/errors.h"
#include "ddp/nccl_communicator.h"
#include "ddp/reducer.h"
#include "launcher/config.h"
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
                       *comm, {4096, 65536, false});
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

}  // namespace
