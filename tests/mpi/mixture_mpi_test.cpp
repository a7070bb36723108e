// data.mixture on W ranks: the samples each step reads, through the sampler, the batch plan and
// the loader's workers, put together over the ranks, are the ones one process reads, step by
// step (a hash of the whole run's order, and each step's samples); the realised mix over the run
// is within 0.5% of the weights; a source that runs out wraps around within the run. Across a kill
// and a resume at another world size: e2e mixture_order_resume_np2_np3 (tests/e2e/e2e.sh).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "common/mpi_test_env.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/gather.h"
#include "train/batches.h"

namespace TRAINER_UNITY_ID {

constexpr int64_t kContext = 16;

// llm.c's uint32 shard of windows whose first token is `base` + the window's index x context, so
// that a window's first input names its source and window.
void write_source(const std::string& dir, int64_t windows, int64_t base) {
  std::filesystem::create_directories(dir);
  const int64_t n = windows * kContext + 1;
  FILE* f = std::fopen((dir + "/train_000.bin").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  int32_t header[256] = {20240801, 7, static_cast<int32_t>(n)};
  std::fwrite(header, 4, 256, f);
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<uint32_t>(base + i);
    std::fwrite(&id, 4, 1, f);
  }
  std::fclose(f);
}

constexpr int64_t kSteps = 40, kBatch = 13;

// Every step's samples (first input of each, in global batch order) as `comm`'s ranks read them.
std::vector<std::vector<int64_t>> read_run(ddp::Communicator& comm, const std::string& yaml) {
  const auto config = config::parse_config(yaml, "mixture.yaml");
  const auto dataset = data::make_dataset(config.data);
  const train::TrainerOptions options = config.trainer_options();
  train::Batches batches(*dataset, options.train, options.loader, comm.size(), comm.rank(),
                         c10::Device(c10::kCPU));
  batches.set_micro_batch(4, false);
  batches.start();
  std::vector<std::vector<int64_t>> steps;
  for (int64_t s = 0; s < kSteps; ++s) {
    const data::Batch b = batches.get(s);
    std::string mine;
    for (int64_t i = 0; i < b.inputs.size(0); ++i) {
      mine += fmt::format("{} ", b.inputs[i][0].item<int64_t>());
    }
    std::vector<int64_t>& step = steps.emplace_back();
    for (const std::string& part : ddp::all_gather_strings(comm, mine)) {  // in rank order
      size_t at = 0;
      while (at < part.size()) {
        const size_t end = part.find(' ', at);
        step.push_back(std::stoll(part.substr(at, end - at)));
        at = end + 1;
      }
    }
  }
  return steps;
}

TEST(MixtureMpiOrder, EveryWorldSizeReadsTheSameSamplesAndTheMixFollowsTheWeights) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  auto self = trainer_test::runtime().self(std::chrono::seconds(60));
  test::TempDir mine;
  const std::string dir = ddp::all_gather_strings(*world, mine.path())[0];
  if (world->rank() == 0) {
    write_source(dir + "/web", 300, 0);
    write_source(dir + "/code", 90, 1'000'000);
    write_source(dir + "/math", 11, 2'000'000);  // 0.1 x 520 samples: it wraps around
  }
  world->barrier("sources written");
  const std::string yaml = fmt::format(
      "model: {{name: gpt, preset: tiny}}\n"
      "data: {{dataset: tokens, context: {}, vocab_size: 3000000, workers: 2, prefetch: 3, "
      "mixture: [{{path: {}/web, weight: 6}}, {{path: {}/code, weight: 3}}, "
      "{{path: {}/math, weight: 1}}]}}\n"
      "train: {{global_batch_size: {}, seed: 17}}\n",
      kContext, dir, dir, dir, kBatch);
  const auto many = read_run(*world, yaml);
  const auto one = read_run(*self, yaml);
  ASSERT_EQ(many.size(), one.size());
  std::hash<std::string> hash;
  std::string run_many, run_one;
  std::vector<double> count(3, 0);
  for (int64_t s = 0; s < kSteps; ++s) {
    EXPECT_EQ(many[s], one[s]) << "step " << s + 1 << " on " << world->size() << " ranks";
    ASSERT_EQ(one[s].size(), static_cast<size_t>(kBatch));
    for (const int64_t first : one[s]) ++count[first / 1'000'000];
    run_many += fmt::format("{}", fmt::join(many[s], ","));
    run_one += fmt::format("{}", fmt::join(one[s], ","));
  }
  EXPECT_EQ(hash(run_many), hash(run_one));
  const double weights[] = {0.6, 0.3, 0.1};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(count[k] / double(kSteps * kBatch), weights[k], 0.005) << "source " << k;
  }
  if (world->rank() == 0) {
    fmt::print("mixture: {} steps on {} ranks read what 1 does (hash {:x}); realised mix {:.4f} "
               "{:.4f} {:.4f}\n",
               kSteps, world->size(), hash(run_one), count[0] / (kSteps * kBatch),
               count[1] / (kSteps * kBatch), count[2] / (kSteps * kBatch));
  }
  world->barrier("done with rank 0's directory");
}

}  // namespace TRAINER_UNITY_ID
