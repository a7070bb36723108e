// Resuming across ranks: 6 steps, a checkpoint, a new model and Trainer resumed from it (rank 0
// alone reads the file), 6 more steps: the same parameters and AdamW moments as 12 steps
// without a break.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "ddp/gather.h"
#include "launcher/config.h"
#include "models/registry.h"
#include "mpi_test_env.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace {

using trainer_test::relative_error;

struct TrainedParams {
  std::vector<at::Tensor> params;
  int64_t steps = 0;
};

const char* kConfig = R"(
model: {name: mlp, hidden_dim: 32, depth: 2}
data: {num_samples: 2000, input_dim: 10, num_classes: 4, teacher_hidden: 8, seed: 2}
train: {device: cpu, global_batch_size: 48, micro_batch_size: 8, steps: 12, lr: 0.01, warmup_steps: 2, grad_clip: 0.5, weight_decay: 0.1, seed: 9}
)";

// Trains steps [resume's step, until) after building the model from `model_seed`.
TrainedParams train_until(ddp::Communicator& comm, int64_t until, uint64_t model_seed,
                const std::string& resume_from, const std::string& save_to) {
  const auto config = launcher::parse_config(kConfig, "resume.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(model_seed);
  auto model = models::create_model(config.model, train::model_shape_for(*dataset));
  std::optional<train::Checkpoint> ckpt;
  if (!resume_from.empty() && comm.rank() == 0) {
    ckpt = train::read_checkpoint(resume_from);
    train::check_compatible(*ckpt, *model);
    train::apply_model_state(*ckpt, *model);
  }
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset, c10::Device(c10::kCPU));
  trainer.resume(ckpt ? &*ckpt : nullptr);
  for (int64_t s = trainer.start_step(); s < until; ++s) trainer.step(s);
  if (!save_to.empty()) trainer.save_checkpoint(save_to, until);
  TrainedParams run;
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().clone());
  run.steps = until;
  return run;
}

TEST(Resume, HalfAndHalfEqualsOneRun) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  // One directory for every rank: rank 0's.
  std::string dir = fmt::format("/tmp/trainer_resume_{}", ::getpid());
  dir = ddp::all_gather_strings(*comm, dir)[0];
  const std::string half = dir + "/step_000006.safetensors";
  const std::string whole = dir + "/step_000012.safetensors";

  const TrainedParams straight = train_until(*comm, 12, 1, "", whole);
  train_until(*comm, 6, 1, "", half);
  comm->barrier("checkpoint written");
  const TrainedParams resumed = train_until(*comm, 12, 77, half, "");  // other initial weights: overwritten
  EXPECT_LT(relative_error(resumed.params, straight.params), 1e-6);

  // The moments too: the resumed run's checkpoint equals the straight one's.
  const std::string again = dir + "/again.safetensors";
  train_until(*comm, 12, 77, half, again);
  if (comm->rank() == 0) {
    const auto a = train::read_checkpoint(whole);
    const auto b = train::read_checkpoint(again);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [key, t] : a.tensors) {
      EXPECT_LT(relative_error({b.tensors.at(key)}, {t}), 1e-6) << key;
    }
    EXPECT_EQ(b.meta.step, 12);
    for (const auto& f : {half, whole, again}) ::unlink(f.c_str());
    ::rmdir(dir.c_str());
  }
  comm->barrier("cleanup");
}

}  // namespace
