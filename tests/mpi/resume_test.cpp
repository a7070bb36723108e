// Resuming across ranks: 6 steps, a checkpoint, a new model and Trainer resumed from it (rank 0
// alone reads the file), 6 more steps: the same parameters and AdamW moments as 12 steps
// without a break.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/mpi_test_env.h"
#include "config/config.h"
#include "ddp/gather.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace {

using trainer_test::relative_error;

const char* kConfig = R"(
model: {name: mlp, hidden_dim: 32, depth: 2}
data: {num_samples: 2000, input_dim: 10, num_classes: 4, teacher_hidden: 8, seed: 2}
train: {device: cpu, global_batch_size: 48, micro_batch_size: 8, steps: 12, lr: 0.01, warmup_steps: 2, grad_clip: 0.5, weight_decay: 0.1, seed: 9}
)";

// Trains steps [resume's step, until) after building the model from `model_seed`.
std::vector<at::Tensor> train_until(ddp::Communicator& comm, int64_t until, uint64_t model_seed,
                                    const std::string& resume_from, const std::string& save_to) {
  return trainer_test::train_until(comm, kConfig, until, model_seed, resume_from, save_to);
}

TEST(Resume, HalfAndHalfEqualsOneRun) {
  auto comm = trainer_test::runtime().world(std::chrono::seconds(60));
  // One directory for every rank: rank 0's.
  std::string dir = fmt::format("/tmp/trainer_resume_{}", ::getpid());
  dir = ddp::all_gather_strings(*comm, dir)[0];
  const std::string half = dir + "/step_000006.safetensors";
  const std::string whole = dir + "/step_000012.safetensors";

  const auto straight = train_until(*comm, 12, 1, "", whole);
  train_until(*comm, 6, 1, "", half);
  comm->barrier("checkpoint written");
  const auto resumed = train_until(*comm, 12, 77, half, "");  // other initial weights: overwritten
  EXPECT_LT(relative_error(resumed, straight), 1e-6);

  // The moments too: the resumed run's checkpoint equals the straight one's.
  const std::string again = dir + "/again.safetensors";
  train_until(*comm, 12, 77, half, again);
  if (comm->rank() == 0) {
    const auto a = checkpoint::read_checkpoint(whole);
    const auto b = checkpoint::read_checkpoint(again);
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
