#include "launcher/banner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp/gather.h"
#include "ddp/shard.h"
#include "train/precision.h"

namespace launcher {
namespace {

int count_nodes(const std::vector<std::string>& hosts) {
  std::vector<std::string> unique = hosts;
  std::sort(unique.begin(), unique.end());
  return static_cast<int>(std::unique(unique.begin(), unique.end()) - unique.begin());
}

// The checkpoint resumed from (rank 0 holds it), and a data order that will differ from the
// original run's.
void log_resume(const checkpoint::Checkpoint& checkpoint, const train::TrainOptions& train) {
  const auto& meta = checkpoint.meta;
  spdlog::info("resumed from {}: {} steps done (written by {} rank(s)); continuing at step {}",
               checkpoint.path, meta.step, meta.world_size, meta.step + 1);
  if (meta.global_batch_size != train.global_batch_size || meta.seed != train.seed) {
    spdlog::warn("the checkpoint was written with train.global_batch_size = {} and train.seed = "
                 "{}, this run has {} and {}: the data order differs from the original run's",
                 meta.global_batch_size, meta.seed, train.global_batch_size, train.seed);
  }
}

// The gradient buckets: how many, their bytes, the first's (ddp.first_bucket_mb) and the cap.
void log_buckets(const train::Trainer& trainer, const ddp::DdpOptions& ddp) {
  const auto& buckets = trainer.reducer().layout();
  int64_t bucket_bytes = 0;
  for (const auto& b : buckets) bucket_bytes += b.bytes();
  spdlog::info("gradients: {} bucket(s), {:.2f} MiB (first {:.2f} MiB, cap {} MiB)", buckets.size(),
               bucket_bytes / 1048576.0, buckets.empty() ? 0.0 : buckets[0].bytes() / 1048576.0,
               ddp.bucket_mb);
}

// The memory plan under the ddp.shard mode in force, every mode side by side (so that the user
// can pick one: docs/reference.md, ddp.shard), and a micro-batch the per-rank batch clamped.
void log_memory_plan(const train::Trainer& trainer, const train::TrainOptions& train) {
  spdlog::info("memory plan (rank 0, ddp.shard: {}): {}", ddp::to_string(trainer.shard_mode()),
               trainer.memory_estimate().describe(trainer.plan().micro_batch));
  std::vector<std::string> modes;
  for (size_t m = 0; m < ddp::kShardModeNames.size(); ++m) {
    const auto f = trainer.footprint(static_cast<ddp::ShardMode>(m));
    modes.push_back(fmt::format("{} {:.2f} / {:.2f} / {:.2f} = {:.2f} MiB", ddp::kShardModeNames[m],
                                f.parameters / 1048576.0, f.gradients / 1048576.0,
                                f.optimizer_state / 1048576.0, f.total() / 1048576.0));
  }
  spdlog::info("per-rank state by ddp.shard (parameters / gradients / optimizer state): {}",
               fmt::join(modes, "; "));
  if (trainer.plan().micro_clamped && train.micro_batch_size > 0) {
    spdlog::warn("train.micro_batch_size = {} exceeds this rank's {} samples per step; using {}",
                 train.micro_batch_size, trainer.plan().per_rank, trainer.plan().per_rank);
  }
}

}  // namespace

std::string spike_guard_line(const train::SpikeGuardOptions& guard, int64_t max_skipped_steps) {
  std::vector<std::string> judged;
  if (guard.loss_z > 0) judged.push_back(fmt::format("its loss is more than {:g}", guard.loss_z));
  if (guard.grad_norm_z > 0) {
    judged.push_back(fmt::format("its gradient norm is more than {:g}", guard.grad_norm_z));
  }
  return fmt::format(
      "loss-spike guard on (train.skip_spikes): a step is skipped when {} standard deviations "
      "above the mean of the last {} applied steps (judged once {} steps are applied), or when its "
      "loss is not finite; {} skipped in a row end the run (train.max_skipped_steps)",
      fmt::join(judged, " or "), guard.window, guard.window, max_skipped_steps);
}

void log_banner(const Startup& s) {
  const config::Config& config = s.config;
  const LaunchInfo& launch = s.launch;
  const train::Trainer* trainer = s.trainer.get();  // null: --evaluate without data
  int64_t n_params = 0;
  for (const auto& p : s.model->parameters()) n_params += p.numel();
  const auto hosts = ddp::all_gather_strings(*s.control, launch.hostname);
  const auto lines = ddp::all_gather_strings(
      *s.control, fmt::format("rank {:>3}  host {}  local rank {}/{}  device {}  threads {} on {}  "
                              "batch {}",
                              s.rank, launch.hostname, launch.local_rank, launch.local_size,
                              s.binding.description, s.threads, s.cpus.describe(),
                              trainer ? trainer->plan().describe() : "none (no data)"));
  spdlog::info(
      "trainer 0.1.0 (LibTorch {}), {}: {} rank(s) on {} node(s), backend {}", TORCH_VERSION,
      launch.launcher == "none" ? "started without a launcher" : "launched by " + launch.launcher,
      launch.world_size, count_nodes(hosts), s.data_comm ? s.data_comm->backend() : s.backend);
  if (trainer) log_buckets(*trainer, config.ddp);
  spdlog::info("model {}: {} parameters; {}", config.model.name, n_params,
               s.dataset
                   ? fmt::format("dataset {}: {} samples; global batch {}", config.data.dataset,
                                 s.dataset->size(), config.train.global_batch_size)
                   : fmt::format("no data set ({})", s.no_data));
  for (const auto& line : lines) spdlog::info("{}", line);
  spdlog::info("precision {}; {}", train::to_string(config.train.precision), s.device_flags);
  if (const auto& guard = config.train.skip_spikes; guard.enabled() && trainer) {
    spdlog::info("{}", spike_guard_line(guard, config.train.max_skipped_steps));
  }
  if (trainer) log_memory_plan(*trainer, config.train);
  if (s.resume_from && !s.weights_only)
    log_resume(*s.resume_from, config.train);  // --evaluate says its own
}

}  // namespace launcher
