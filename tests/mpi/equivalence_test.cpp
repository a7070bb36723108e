// The N-rank vs 1-rank equivalence test (docs/DESIGN.md, "Global batch semantics"): after 20
// optimizer steps, parameters trained on W ranks equal those trained by one process on the same
// global batch, to a relative error below 1e-5, also when the global batch does not divide by W;
// and step 1's reduced gradients and their norm equal the single process's to 1e-6. Each rank
// trains twice: over the whole world, and alone over MPI_COMM_SELF (the 1-rank reference), then
// compares.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/mpi_test_env.h"
#include "config/config.h"
#include "data/registry.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using trainer_test::relative_error;

struct Case {
  int64_t global_batch;
  std::string micro_batch;
  double grad_clip;
  double bucket_mb = 25;  // also the first bucket's cap
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "global_batch " << c.global_batch << " micro " << c.micro_batch << " clip " << c.grad_clip
      << " bucket_mb " << c.bucket_mb;
}

std::string config_text(const Case& c) {
  return fmt::format(R"(
model: {{name: mlp, hidden_dim: 48, depth: 2}}
data: {{num_samples: 2000, input_dim: 12, num_classes: 5, teacher_hidden: 16, seed: 7}}
train:
  device: cpu
  global_batch_size: {}
  micro_batch_size: {}
  steps: 20
  lr: 0.01
  warmup_steps: 3
  grad_clip: {}
  seed: 11
ddp: {{first_bucket_mb: {}, bucket_mb: {}}}
)",
                     c.global_batch, c.micro_batch, c.grad_clip, c.bucket_mb, c.bucket_mb);
}

struct Trained {
  std::vector<at::Tensor> parameters;   // after the last step
  std::vector<at::Tensor> step1_grads;  // the reduced gradients after step 1 (clipped)
  double step1_grad_norm = 0;           // their global norm before clipping
};

Trained train_parameters(ddp::Communicator& comm, const Case& c,
                         std::vector<at::Tensor>* initial = nullptr, size_t* buckets = nullptr) {
  const auto config = config::parse_config(config_text(c), "equivalence.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  auto model = models::create_model(config.model, dataset->shape());
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU));
  if (buckets != nullptr) *buckets = trainer.reducer().layout().size();
  if (initial != nullptr) {
    for (const auto& p : model->parameters()) initial->push_back(p.detach().clone());
  }
  Trained out;
  for (int64_t s = 1; s <= config.train.steps; ++s) {
    const train::StepResult r = trainer.step(s);
    if (s > 1) continue;
    out.step1_grad_norm = r.grad_norm;
    for (const auto& p : model->parameters()) out.step1_grads.push_back(p.grad().detach().clone());
  }
  for (const auto& p : model->parameters()) out.parameters.push_back(p.detach().clone());
  return out;
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, WorldMatchesSingleProcess) {
  const Case c = GetParam();
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  std::vector<at::Tensor> initial;
  size_t buckets = 0;
  const Trained distributed = train_parameters(*world, c, &initial, &buckets);
  const Trained reference = train_parameters(*self, c);
  ASSERT_EQ(distributed.parameters.size(), reference.parameters.size());
  // Step 1's gradients, tightly: AdamW's update hardly changes when every gradient is off by a
  // constant factor (a wrong mean over ranks), their norm and values do.
  const double grad_err = relative_error(distributed.step1_grads, reference.step1_grads);
  EXPECT_LT(grad_err, 1e-6) << "step 1 gradients, world " << world->size();
  EXPECT_GT(reference.step1_grad_norm, 0);
  EXPECT_NEAR(distributed.step1_grad_norm, reference.step1_grad_norm,
              1e-6 * reference.step1_grad_norm);
  const double err = relative_error(distributed.parameters, reference.parameters);
  EXPECT_LT(err, 1e-5) << "world " << world->size() << " global batch " << c.global_batch;
  // The comparison means something only if training moved the parameters.
  EXPECT_GT(relative_error(reference.parameters, initial), 1e-2);
  // And every rank holds the same parameters.
  for (const auto& p : distributed.parameters) {
    at::Tensor max = p.clone();
    at::Tensor min = p.clone();
    world->all_reduce(max, ddp::ReduceOp::kMax);
    world->all_reduce(min, ddp::ReduceOp::kMin);
    EXPECT_TRUE(at::equal(max, min));
  }
  if (world->rank() == 0) {
    fmt::print("world {} global batch {} micro {} buckets {} ({} MiB): relative error {:.2e}, "
               "step 1 gradients {:.2e} (norm {:.6g})\n",
               world->size(), c.global_batch, c.micro_batch, buckets, c.bucket_mb, err, grad_err,
               distributed.step1_grad_norm);
  }
}

INSTANTIATE_TEST_SUITE_P(
    GlobalBatches, Equivalence,
    ::testing::Values(Case{12, "auto", 1.0},  // divides by 1, 2, 3
                      Case{13, "auto", 1.0},  // divides by none
                      Case{13, "2", 1.0},     // micro-batches with accumulation, uneven
                      Case{7, "1", 0.05},     // one sample per micro-batch; clipping active
                      Case{32, "5", 0.0},     // no clipping, ragged last micro-batch
                      Case{13, "2", 1.0, 1.0 / 1024},  // 1 KB buckets: many, params split
                      Case{13, "2", 1.0, 65536}));     // one bucket for everything

}  // namespace TRAINER_UNITY_ID
