// The fixture of the mpi tests that write checkpoints at one world size and read them at another
// (shard_mpi_test.cpp's ShardMpiResume, sharded_resume_test.cpp's ShardedResume): the world, its
// first W - 1 ranks as a smaller job, and one directory every rank names alike, removed with the
// files and step directories a test registered in it.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "checkpoint/files.h"
#include "common/mpi_test_env.h"
#include "ddp/communicator.h"
#include "ddp/gather.h"

namespace trainer_test {

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = runtime().world(std::chrono::seconds(60));
    if (world_->size() < 2) GTEST_SKIP() << "needs 2 ranks";
    smaller_ = all_but_last_rank(*world_);
    dir_ = ddp::all_gather_strings(
        *world_, fmt::format("/tmp/trainer_checkpoints_{}_{}", test_name(), ::getpid()))[0];
  }
  void TearDown() override {
    if (!world_ || world_->size() < 2) return;
    world_->barrier("cleanup");
    if (world_->rank() == 0) {
      for (const auto& f : files_) ::unlink(f.c_str());
      for (const auto& d : dirs_) checkpoint::remove_step_dir(d);
      ::rmdir(dir_.c_str());
    }
  }
  // A file in the directory, removed at the end.
  std::string file(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }
  // A sharded checkpoint's step directory (saved as NAME.safetensors, read as NAME), removed at
  // the end.
  std::string step_dir(const std::string& name) {
    dirs_.push_back(dir_ + "/" + name);
    return dirs_.back();
  }

  std::unique_ptr<ddp::Communicator> world_;
  std::unique_ptr<ddp::Communicator> smaller_;  // ranks 0 .. W - 2; null on the last rank
  std::string dir_;

 private:
  static std::string test_name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
  }
  std::vector<std::string> files_;
  std::vector<std::string> dirs_;
};

}  // namespace trainer_test
