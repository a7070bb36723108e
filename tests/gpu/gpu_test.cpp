// GPU tier: NCCL at world size 1, the Reducer on CUDA tensors, GPU training against CPU
// training, the memory plan and a real OOM, the chunked output layer and TF32 (the step through
// the Trainer, CUDA graphs and host syncs: gpu_step_test.cpp). Every test skips with a reason
// where no CUDA device is present; on a GPU machine they run in full, and fail where the build
// has no NCCL. Run under mpirun -np 1 (MPI is the control plane that bootstraps NCCL).
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <chrono>
#include <utility>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/errors.h"
#include "ddp/nccl_communicator.h"
#include "ddp/reducer.h"
#include "gpu_test_util.h"
#include "memory/memory_stats.h"
#include "models/cnn.h"
#include "models/gpt/gpt.h"
#include "models/lm/linear_cross_entropy.h"
#include "models/registry.h"
#include "models/sequence.h"
#include "train/precision.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using test::nccl;
using test::write_token_shard;

TEST(Gpu, NcclAllReduceEveryOpAndDtypeAtWorldOne) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto comm = nccl(*control);
  EXPECT_EQ(comm->backend(), "nccl");
  const int w = comm->size();
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    for (auto op :
         {ddp::ReduceOp::kSum, ddp::ReduceOp::kMax, ddp::ReduceOp::kMin, ddp::ReduceOp::kAvg}) {
      if (op == ddp::ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
      at::Tensor t =
          at::arange(1000, at::TensorOptions().dtype(at::kLong)).remainder(7).to(dtype).cuda();
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

// ZeRO's collectives (ddp.shard): reduce-scatter (every dtype, sum and avg) and the in-place
// all-gather the Reducer uses for the parameters.
TEST(Gpu, NcclReduceScatterAndInPlaceAllGather) {
  SKIP_WITHOUT_GPU();
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto comm = nccl(*control);
  const int64_t w = comm->size(), n = 37;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg}) {
      if (op == ddp::ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
      const at::Tensor input = at::arange(w * n, at::kLong).remainder(11).to(dtype).to(at::kCUDA);
      at::Tensor output = at::full({n}, -1, cuda.dtype(dtype));
      comm->reduce_scatter(output, input, op, "gpu test");
      at::Tensor expected = input.narrow(0, comm->rank() * n, n).cpu();
      if (op == ddp::ReduceOp::kSum) expected = expected * w;
      EXPECT_TRUE(at::equal(output.cpu(), expected))
          << c10::toString(dtype) << " " << ddp::to_string(op);
    }
  }
  at::Tensor flat = at::full({w * n}, -1.0, cuda);
  flat.narrow(0, comm->rank() * n, n).fill_(comm->rank());
  comm->all_gather(flat, flat.narrow(0, comm->rank() * n, n), "in place");
  for (int64_t r = 0; r < w; ++r) {
    EXPECT_TRUE(at::equal(flat.narrow(0, r * n, n).cpu(), at::full({n}, double(r))));
  }
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
  ddp::Reducer reducer(
      {{"a.weight", a->weight}, {"a.bias", a->bias}, {"b.weight", b->weight}, {"b.bias", b->bias}},
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
                              ddp::Communicator& data, const std::string& yaml = R"(
model: {name: mlp, hidden_dim: 64, depth: 2}
data: {num_samples: 1024, input_dim: 16, num_classes: 5, teacher_hidden: 16, seed: 3}
train: {global_batch_size: 32, micro_batch_size: 8, steps: 20, lr: 0.01, warmup_steps: 2, seed: 5}
)") {
  const auto config = config::parse_config(yaml, "gpu.yaml", {"train.device=" + device});
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  const c10::Device dev = device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  train::Trainer trainer(config.trainer_options(), control, data, model, *dataset, dev);
  for (int64_t s = 1; s <= config.train.steps; ++s) trainer.step(s);
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

// The tokens -> gpt path on the GPU: the loader's workers fill pinned host memory, micro-batches
// are copied on a side stream (non_blocking), blocks are checkpointed; the result matches the
// same run on the CPU.
TEST(Gpu, GptFromTokenShardsOnGpuMatchesCpu) {
  SKIP_WITHOUT_GPU();
  at::globalContext().setAllowTF32CuBLAS(false);
  test::TempDir dir;
  write_token_shard(dir.path());
  const std::string yaml = "model: {name: gpt, preset: tiny, checkpoint_activations: true}\n"
                           "data: {dataset: tokens, path: " +
                           dir.path() +
                           ", context: 32, "
                           "vocab_size: 256, workers: 2, prefetch: 3}\n"
                           "train: {global_batch_size: 16, micro_batch_size: 4, steps: 8, "
                           "lr: 0.003, warmup_steps: 2, seed: 5}\n";
  auto control = trainer_test::runtime().world(std::chrono::seconds(60));
  auto gpu_comm = nccl(*control);
  const auto on_gpu = train("cuda", *control, *gpu_comm, yaml);
  const auto on_cpu = train("cpu", *control, *control, yaml);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < on_gpu.size(); ++i) {
    diff += (on_gpu[i] - on_cpu[i]).pow(2).sum().item<double>();
    norm += on_cpu[i].pow(2).sum().item<double>();
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-4);
}

// The same weights and batch on CUDA (cuDNN LSTM, fused attention, cuDNN convolutions, channels
// last) and on the CPU: loss and gradients agree to fp32 rounding.
void expect_cuda_matches_cpu(const std::shared_ptr<models::Model>& cpu_model,
                             const std::shared_ptr<models::Model>& cuda_model,
                             const at::Tensor& inputs, const at::Tensor& targets,
                             bool channels_last = false) {
  {
    at::NoGradGuard no_grad;
    auto src = cpu_model->parameters();
    auto dst = cuda_model->parameters();
    ASSERT_EQ(src.size(), dst.size());
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  cuda_model->to(at::kCUDA);
  at::Tensor x = inputs.cuda();
  if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);  // cuDNN's NHWC kernels
  const at::Tensor cpu_loss = cpu_model->loss(inputs, targets);
  cpu_loss.backward();
  const at::Tensor cuda_loss = cuda_model->loss(x, targets.cuda());
  cuda_loss.backward();
  EXPECT_NEAR(cuda_loss.item<double>(), cpu_loss.item<double>(),
              1e-4 * std::abs(cpu_loss.item<double>()));
  auto a = cpu_model->named_parameters();
  auto b = cuda_model->named_parameters();
  for (const auto& item : a) {
    const at::Tensor g = item.value().grad();
    const at::Tensor h = b[item.key()].grad().cpu();
    const double err = (g - h).norm().item<double>() / std::max(1e-30, g.norm().item<double>());
    EXPECT_LT(err, 1e-4) << item.key();
  }
}

TEST(Gpu, SequenceAndCnnOnCudaMatchCpu) {
  SKIP_WITHOUT_GPU();
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  for (const auto cell : {models::SequenceCell::kLstm, models::SequenceCell::kTransformer}) {
    models::SequenceOptions o;
    o.cell = cell;
    o.features = 5;
    o.window = 24;
    o.horizon = 3;
    o.targets = 2;
    o.hidden_dim = 32;
    o.num_layers = 2;
    o.d_model = 32;
    o.heads = 4;
    at::manual_seed(7);
    auto cpu = std::make_shared<models::SequenceForecaster>(o);
    auto cuda = std::make_shared<models::SequenceForecaster>(o);
    SCOPED_TRACE(models::kSequenceCellNames.at(static_cast<size_t>(cell)));
    expect_cuda_matches_cpu(cpu, cuda, at::randn({6, 24, 5}), at::randn({6, 3, 2}));
  }
  for (int64_t scale : {1, 2}) {
    models::CnnOptions o;
    o.channels = 3;
    o.scale = scale;
    o.base_channels = 16;
    o.num_blocks = 2;
    o.loss = models::CnnLoss::kL1;
    at::manual_seed(7);
    auto cpu = std::make_shared<models::RestorationCnn>(o);
    auto cuda = std::make_shared<models::RestorationCnn>(o);
    SCOPED_TRACE(scale);
    expect_cuda_matches_cpu(cpu, cuda, at::rand({4, 3, 16, 16}),
                            at::rand({4, 3, 16 * scale, 16 * scale}),
                            /*channels_last=*/true);
  }
}

// Activation checkpointing on CUDA under bf16 autocast with dropout: the recompute draws the same
// dropout masks (the CUDA generator's state is restored) in the same precision, so loss and
// gradients equal the plain run's.
TEST(Gpu, GptCheckpointingUnderBf16WithDropoutMatchesPlain) {
  SKIP_WITHOUT_GPU();
  models::GptOptions o = models::gpt_preset("tiny");
  o.vocab_size = 256;
  o.context = 64;
  o.dropout = 0.1;
  auto run = [&](bool checkpointing) {
    o.checkpoint_activations = checkpointing;
    at::manual_seed(3);
    models::Gpt model(o);
    model.to(at::kCUDA);
    model.train();
    const at::Tensor tokens =
        at::randint(256, {8, 64}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
    at::manual_seed(11);  // the dropout masks
    at::Tensor loss;
    {
      train::AutocastScope autocast(c10::Device(c10::kCUDA, 0), train::Precision::kBf16);
      loss = model.loss(tokens, tokens);
    }
    loss.backward();
    std::vector<at::Tensor> out{loss.detach().cpu()};
    for (const auto& p : model.parameters()) out.push_back(p.grad().cpu());
    return out;
  };
  const auto plain = run(false);
  const auto checkpointed = run(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  EXPECT_TRUE(at::equal(plain[0], checkpointed[0])) << plain[0] << " vs " << checkpointed[0];
  for (size_t i = 1; i < plain.size(); ++i) {
    const double err = (plain[i] - checkpointed[i]).norm().item<double>() /
                       std::max(1e-30, plain[i].norm().item<double>());
    EXPECT_LT(err, 1e-3) << "gradient " << i;  // bf16; mismatched dropout masks give ~1
  }
}

// A wide MLP whose activations dominate its memory, on the GPU.
std::unique_ptr<train::Trainer> gpu_trainer(ddp::Communicator& control, ddp::Communicator& data,
                                            const std::vector<std::string>& overrides,
                                            std::shared_ptr<models::Model>* model_out,
                                            std::unique_ptr<data::Dataset>* data_out) {
  const auto config = config::parse_config(R"(
model: {name: mlp, hidden_dim: 4096, depth: 4}
data: {num_samples: 16384, input_dim: 256, num_classes: 16, teacher_hidden: 64, seed: 3}
train: {device: cuda, global_batch_size: 8192, steps: 6, lr: 0.001, warmup_steps: 1, seed: 5}
)",
                                           "gpu-memory.yaml", overrides);
  *data_out = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  *model_out = models::create_model(config.model, (*data_out)->shape());
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
  trainer->step(1);
  memory::reset_peaks(c10::Device(c10::kCUDA, 0));
  for (int64_t s = 2; s <= 4; ++s) trainer->step(s);
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
  for (int64_t s = 1; s <= 6; ++s) trainer->step(s);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  EXPECT_GE(trainer->fallbacks(), 1);
  EXPECT_LE(trainer->plan().micro_batch, 4096);
}

// The chunked output layer (models/linear_cross_entropy) at GPT-2's width on the GPU, under bf16
// autocast: about as close to the fp32 result as linear + cross_entropy, at a fraction of its peak
// memory. The time of each is printed (a datum for bench/RESULTS.md, not asserted).
TEST(Gpu, ChunkedOutputLayerMatchesUnfusedUnderBf16WithLessMemory) {
  SKIP_WITHOUT_GPU();
  const c10::Device dev(c10::kCUDA, 0);
  const int64_t rows = 8192, d = 768, vocab = 50257, padded = 50304;
  at::manual_seed(0);
  const auto options = at::TensorOptions().device(dev);
  const at::Tensor h0 = at::randn({rows, d}, options);
  const at::Tensor w0 = at::randn({padded, d}, options) * 0.05;
  const at::Tensor targets = at::randint(vocab, {rows}, options.dtype(at::kLong));
  struct Run {
    at::Tensor loss, grad_h, grad_w;
    double peak_mib = 0, ms = 0;
  };
  const auto run = [&](bool chunked, bool bf16) {
    Run r;
    for (int rep = 0; rep < 4; ++rep) {  // the first is a warm-up; the last three are timed
      const at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      c10::cuda::device_synchronize();
      memory::reset_peaks(dev);
      const int64_t base = memory::sample_memory(dev).tensor_bytes;
      const auto start = std::chrono::steady_clock::now();
      at::Tensor loss;
      {
        train::AutocastScope autocast(dev,
                                      bf16 ? train::Precision::kBf16 : train::Precision::kFp32);
        loss = chunked ? models::linear_cross_entropy(h, w, targets, vocab)
                       : at::cross_entropy_loss(at::linear(h, w).narrow(1, 0, vocab), targets);
      }
      loss.backward();
      c10::cuda::device_synchronize();
      if (rep > 0) {
        r.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count() /
                3;
      }
      r.peak_mib = double(memory::sample_memory(dev).tensor_peak_bytes - base) / 1048576;
      r.loss = loss.detach();
      r.grad_h = h.grad();
      r.grad_w = w.grad();
    }
    return r;
  };
  const Run exact = run(false, false), unfused = run(false, true), chunked = run(true, true);
  const auto err = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm())
        .item<double>();
  };
  std::printf("[output layer] %ld x %ld -> %ld, bf16: unfused %.2f ms, peak %.0f MiB; chunked "
              "%.2f ms, peak %.0f MiB\n",
              rows, d, padded, unfused.ms, unfused.peak_mib, chunked.ms, chunked.peak_mib);
  const std::pair<const char*, std::pair<double, double>> errors[] = {
      {"loss", {err(unfused.loss, exact.loss), err(chunked.loss, exact.loss)}},
      {"gradient of h", {err(unfused.grad_h, exact.grad_h), err(chunked.grad_h, exact.grad_h)}},
      {"gradient of the weight",
       {err(unfused.grad_w, exact.grad_w), err(chunked.grad_w, exact.grad_w)}}};
  for (const auto& [what, e] : errors) {
    std::printf("[output layer] %s: relative error against fp32 %.2e unfused, %.2e chunked\n", what,
                e.first, e.second);
    EXPECT_LT(e.second, 2 * e.first + 1e-6) << what;
  }
  EXPECT_LT(chunked.peak_mib, unfused.peak_mib / 3);
}

// train.tf32: cuBLAS runs fp32 matmuls on TF32 tensor cores only when asked (auto: from Ampere).
TEST(Gpu, Tf32FlagDecidesMatmulPrecision) {
  SKIP_WITHOUT_GPU();
  const c10::Device dev(c10::kCUDA, 0);
  const at::Tensor a = at::randn({1024, 1024}, at::TensorOptions().device(dev));
  const at::Tensor b = at::randn({1024, 1024}, at::TensorOptions().device(dev));
  const at::Tensor exact = at::matmul(a.to(at::kDouble), b.to(at::kDouble));
  auto error = [&] {
    return ((at::matmul(a, b).to(at::kDouble) - exact).norm() / exact.norm()).item<double>();
  };
  EXPECT_NE(train::apply_device_flags(dev, train::Switch::kOff, false)
                .find("TF32 matmuls and convolutions off"),
            std::string::npos);
  EXPECT_FALSE(train::tf32_enabled());
  const double fp32 = error();
  const std::string line = train::apply_device_flags(dev, train::Switch::kAuto, true);
  EXPECT_NE(line.find("TF32 matmuls and convolutions on"), std::string::npos) << line;
  EXPECT_NE(line.find("cuDNN autotuning on"), std::string::npos) << line;
  EXPECT_TRUE(train::tf32_enabled());
  const double tf32 = error();
  std::printf("[tf32] matmul relative error: fp32 %.2e, tf32 %.2e\n", fp32, tf32);
  EXPECT_LT(fp32, 1e-5);
  EXPECT_GT(tf32, 10 * fp32);  // 10 mantissa bits instead of 23
  EXPECT_LT(tf32, 1e-2);
  train::apply_device_flags(dev, train::Switch::kOff, false);
}

}  // namespace TRAINER_UNITY_ID
