// A periodic checkpoint the file system has no room for (checkpoint/checkpointer.h): training goes
// on until checkpoint.max_failed_writes of them fail in a row, and a complete checkpoint between
// failures starts the count again. The disk is full where a test says so: the write's temporary
// file is a symbolic link to /dev/full, whose writes fail with ENOSPC as a full disk's do (the
// e2e tier's checkpoint_disk_full fills a real tmpfs; it cannot choose which writes fail).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpointer.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/registry.h"
#include "fake_communicator.h"
#include "models/registry.h"
#include "train/loop.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

struct DiskFullRun {
  test::TempDir dir;
  trainer_test::FakeCommunicator control, data;
  std::unique_ptr<data::Dataset> dataset;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;

  explicit DiskFullRun(int64_t max_failed_writes) {
    const auto config = config::parse_config(
        fmt::format(
            "model: {{name: mlp, hidden_dim: 16, depth: 1}}\n"
            "data: {{dataset: synthetic, num_samples: 64, input_dim: 8, num_classes: 4, "
            "teacher_hidden: 8}}\n"
            "train: {{device: cpu, global_batch_size: 8, steps: 10, warmup_steps: 1, threads: 1}}\n"
            "checkpoint: {{dir: {}, every: 2, format: single, async: false, "
            "max_failed_writes: {}}}\n",
            dir.path(), max_failed_writes),
        "disk-full.yaml");
    dataset = data::make_dataset(config.data);
    model = models::create_model(config.model, dataset->shape());
    trainer = std::make_unique<train::Trainer>(config.trainer_options(), control, data, model,
                                               *dataset, c10::Device(c10::kCPU));
    checkpointer = train::make_checkpointer(*trainer, "");
  }

  std::string path(int64_t step) const {
    return checkpointer->path_of(fmt::format("step_{:06d}", step));
  }
  // The periodic checkpoint of `step`, as the loop writes it (it may fail for want of space).
  void save(int64_t step) {
    checkpointer->save(path(step), step, trainer->run_state(), checkpoint::Need::kMayFail);
  }
  // The next write of `step` finds the disk full.
  void fill_for(int64_t step) const {
    ASSERT_EQ(::symlink("/dev/full", (path(step) + ".tmp").c_str()), 0) << path(step);
  }
};

TEST(CheckpointDiskFull, ACompleteCheckpointStartsTheCountOfFailuresAgain) {
  DiskFullRun run(2);
  run.fill_for(2);
  EXPECT_NO_THROW(run.save(2));  // 1 of 2 in a row: training goes on
  EXPECT_FALSE(std::filesystem::exists(run.path(2)));
  EXPECT_FALSE(std::filesystem::is_symlink(run.path(2) + ".tmp"));  // the partial file is gone
  EXPECT_NO_THROW(run.save(4));                                     // complete
  EXPECT_TRUE(std::filesystem::exists(run.path(4)));
  run.fill_for(6);
  EXPECT_NO_THROW(run.save(6));  // 1 of 2 again, not 2 of 2
  run.fill_for(8);
  try {  // 2 of 2 in a row: the job stops (exit 5), naming the last complete checkpoint
    run.save(8);
    ADD_FAILURE() << "the second failure in a row did not stop the run";
  } catch (const checkpoint::CheckpointNotWritten& e) {
    EXPECT_NE(std::string(e.what()).find("2 checkpoints failed in a row"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("last complete checkpoint: " + run.path(4)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace TRAINER_UNITY_ID
