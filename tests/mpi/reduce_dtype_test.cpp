// ddp.reduce_dtype: bf16 (ddp/reducer.h): the gradient buckets are all-reduced in bfloat16 and
// cast back, so only the wire carries bf16. These tests measure the error that adds against the
// float32 reduction on the same model, data and ranks, and hold it to bfloat16's rounding.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

using Trained = trainer_test::CpuRun;

Trained make(ddp::Communicator& comm, const std::string& reduce_dtype) {
  return trainer_test::make_cpu_run(
      comm,
      "model: {name: mlp, hidden_dim: 256, depth: 2}\n"
      "data: {num_samples: 4096, input_dim: 32, num_classes: 8, teacher_hidden: 16, seed: 3}\n"
      "train: {device: cpu, global_batch_size: 64, micro_batch_size: 16, steps: 40, lr: 0.003,\n"
      "        warmup_steps: 2, seed: 5, grad_clip: 0}\n"
      "ddp: {reduce_dtype: " +
          reduce_dtype + "}\n",
      "reduce-dtype.yaml");
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

TEST(ReduceDtype, Bf16BucketsHalveTheWireAndStayWithinBf16Rounding) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  Trained fp32 = make(*world, "fp32");
  Trained bf16 = make(*world, "bf16");
  int64_t gradient_bytes = 0;
  for (const auto& b : fp32.trainer->reducer().buffers()) gradient_bytes += b.nbytes();
  EXPECT_EQ(fp32.trainer->reducer().communication_bytes(), 0);
  // Half the bytes, plus the loss riding in the first bucket (train/model_state.h), in bf16 too.
  const int64_t rider_bytes = bf16.trainer->reducer().rider().numel() * 2;
  EXPECT_EQ(rider_bytes, 2);
  EXPECT_EQ(bf16.trainer->reducer().communication_bytes(), gradient_bytes / 2 + rider_bytes);

  // Step 1 from the same parameters: the reduced gradients (still in the buckets, no clipping).
  fp32.trainer->step(1);
  bf16.trainer->step(1);
  const double grad_error = relative_error(copies(bf16.trainer->reducer().buffers()),
                                           copies(fp32.trainer->reducer().buffers()));
  // bfloat16 keeps 8 significant bits: one rounding of each rank's gradient and of each partial
  // sum is a relative error of at most 2^-8 per element; nothing at all would mean bf16 never ran.
  EXPECT_GT(grad_error, 0.0);
  EXPECT_LT(grad_error, std::ldexp(1.0, -8));

  double loss32 = 0, loss16 = 0;
  for (int64_t s = 2; s <= 40; ++s) {
    loss32 = fp32.trainer->step(s).loss;
    loss16 = bf16.trainer->step(s).loss;
  }
  const double param_error =
      relative_error(copies(bf16.model->parameters()), copies(fp32.model->parameters()));
  const double loss_error = std::abs(loss16 - loss32) / loss32;
  EXPECT_LT(loss_error, 0.02);
  EXPECT_LT(param_error, 1e-2);
  if (world->rank() == 0) {
    std::printf("[reduce_dtype bf16, %d ranks] gradient error after step 1: %.2e; after 40 steps: "
                "parameters %.2e, loss %.5f vs fp32 %.5f (%.2e)\n",
                world->size(), grad_error, param_error, loss16, loss32, loss_error);
  }
}

}  // namespace TRAINER_UNITY_ID
