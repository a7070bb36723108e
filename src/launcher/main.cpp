// trainer: the command line, the start-up of one rank, and the only place that decides to exit.
//
// Start-up runs in phases (launch + config, then devices + data + model). Each phase ends with a
// vote over MPI, so a user mistake seen on any rank ends every rank with exit code 2 and one
// message, and no rank is left waiting in a collective.

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <optional>
#include <thread>

#include "data/dataset.h"
#include "data/errors.h"
#include "ddp/backend.h"
#include "ddp/batch_plan.h"
#include "ddp/errors.h"
#include "ddp/gather.h"
#include "ddp/mpi_runtime.h"
#include "ddp/nccl_communicator.h"
#include "ddp/rank_sampler.h"
#include "launcher/config.h"
#include "launcher/device.h"
#include "launcher/exit_codes.h"
#include "launcher/generate_command.h"
#include "launcher/launch.h"
#include "launcher/logging.h"
#include "launcher/signals.h"
#include "memory/allocator_guard.h"
#include "memory/oom.h"
#include "models/registry.h"
#include "train/checkpoint.h"
#include "train/error_text.h"
#include "train/precision.h"
#include "train/report/metrics.h"
#include "train/report/tensorboard.h"
#include "train/trainer.h"

namespace launcher {
namespace {

struct CommandLine {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  bool dry_run = false;
  bool help_config = false;
  bool generate = false;      // --generate PROMPT (launcher/generate_command.h)
  GenerateArgs generate_args;
  std::string export_hf;      // --export-hf DIR
};

// What one rank found in a start-up phase: 0, or the exit code and the message.
struct Outcome {
  int code = kExitOk;
  std::string message;
};

void print_error(int rank, const std::string& message) {
  if (rank == 0) {
    fmt::print(stderr, "trainer: error: {}\n", message);
  } else {
    fmt::print(stderr, "trainer: error on rank {}: {}\n", rank, message);
  }
  std::fflush(stderr);
}

// Every rank learns whether any rank failed. Rank 0 prints its own error; a failing rank prints
// its error only when rank 0 had none (then it is news). Returns the exit code all ranks use.
int agree(ddp::Communicator& comm, const Outcome& mine) {
  at::Tensor vote = at::tensor({mine.code, comm.rank() == 0 ? mine.code : 0}, at::kInt);
  comm.all_reduce(vote, ddp::ReduceOp::kMax, "start-up vote");
  const int code = vote[0].item<int>();
  const bool rank0_failed = vote[1].item<int>() != 0;
  if (mine.code != kExitOk && (comm.rank() == 0 || !rank0_failed)) print_error(comm.rank(), mine.message);
  return code;
}

using train::first_line;

// Runs one start-up phase of this rank; `doing` names it in an out-of-memory message.
template <class Fn>
Outcome attempt(const char* doing, Fn&& fn) {
  try {
    fn();
    return {};
  } catch (const ConfigError& e) {
    return {kExitUsage, e.what()};
  } catch (const LaunchError& e) {
    return {kExitUsage, e.what()};
  } catch (const DeviceError& e) {
    return {kExitUsage, e.what()};
  } catch (const ddp::PlanError& e) {
    return {kExitUsage, e.what()};
  } catch (const train::CheckpointError& e) {
    return {kExitUsage, e.what()};
  } catch (const std::invalid_argument& e) {
    return {kExitUsage, e.what()};
  } catch (const memory::OutOfMemoryFatal& e) {
    return {kExitOutOfMemory, e.what()};  // agreed by every rank (Trainer construction)
  } catch (const c10::OutOfMemoryError& e) {
    return {kExitOutOfMemory,
            fmt::format("out of memory {}: {}\nGive each rank more memory (memory.cpu_budget_mb "
                        "on CPU, memory.fraction on a GPU) or use a smaller model or data set.",
                        doing, first_line(e.what_without_backtrace()))};
  } catch (const c10::Error& e) {
    return {kExitFailure, e.what_without_backtrace()};  // LibTorch's backtrace helps no user
  } catch (const std::exception& e) {
    return {kExitFailure, e.what()};
  }
}

int parse_command_line(int argc, char** argv, CommandLine& cli) {
  CLI::App app{"trainer: data-parallel training with LibTorch over NCCL and MPI.\n"
               "Start one process per GPU: mpirun -np 8 trainer --config run.yaml"};
  app.add_option("--config", cli.config_path, "YAML run configuration")->check(CLI::ExistingFile);
  app.add_option("--set", cli.overrides, "override a key: --set section.key=value (repeatable)")
      ->take_all();
  app.add_flag("--print-config", cli.print_config, "print the effective configuration and exit");
  app.add_flag("--dry-run", cli.dry_run, "print the plan (ranks, devices, batches, model) and exit");
  app.add_flag("--help-config", cli.help_config, "list every config key with type, default, range");
  GenerateArgs& g = cli.generate_args;
  auto* generate = app.add_option("--generate", g.prompt,
                                  "write PROMPT and a continuation from the config's weights, exit");
  app.add_option("--max-new-tokens", g.max_new_tokens, "--generate: tokens to add")
      ->check(CLI::NonNegativeNumber)->needs(generate);
  app.add_option("--temperature", g.temperature, "--generate: sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)->needs(generate);
  app.add_option("--top-k", g.top_k, "--generate: sample among the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)->needs(generate);
  app.add_option("--seed", g.seed, "--generate: sampling seed")->needs(generate);
  app.add_option("--export-hf", cli.export_hf,
                 "write the config's weights as a Hugging Face GPT-2 (config.json, "
                 "model.safetensors) to DIR, exit")->excludes(generate);
  app.set_version_flag("--version", fmt::format("trainer 0.1.0 (LibTorch {})", TORCH_VERSION));
  const bool speaks = launcher_rank(process_environment()) == 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      if (speaks) app.exit(e);
      return kExitOk + 1000;  // printed help or version: done
    }
    if (speaks) fmt::print(stderr, "trainer: error: {}\nRun 'trainer --help' for usage.\n", e.what());
    return kExitUsage;
  }
  cli.generate = generate->count() > 0;
  if (cli.help_config) {
    if (speaks) fmt::print("{}", config_reference());
    return kExitOk + 1000;
  }
  if (cli.config_path.empty()) {
    if (speaks) fmt::print(stderr, "trainer: error: --config FILE is required\nRun 'trainer --help' for usage.\n");
    return kExitUsage;
  }
  return kExitOk;
}

int count_nodes(const std::vector<std::string>& hosts) {
  std::vector<std::string> unique = hosts;
  std::sort(unique.begin(), unique.end());
  return static_cast<int>(std::unique(unique.begin(), unique.end()) - unique.begin());
}

int train_with_mpi(ddp::MpiRuntime& mpi, const CommandLine& cli);

int run(int argc, char** argv) {
  install_preemption_handler();
  CommandLine cli;
  if (const int rc = parse_command_line(argc, argv, cli); rc != kExitOk) {
    return rc >= 1000 ? rc - 1000 : rc;
  }
  // One process, no MPI: the language-model commands (under mpirun, rank 0 alone works).
  if (cli.generate) return run_generate(cli.config_path, cli.overrides, cli.generate_args);
  if (!cli.export_hf.empty()) return run_export_hf(cli.config_path, cli.overrides, cli.export_hf);
  try {
    check_launch_before_mpi(process_environment());
  } catch (const LaunchError& e) {
    // Every task finds the same: the first one speaks for the job.
    if (launcher_rank(process_environment()) == 0) print_error(0, e.what());
    return kExitUsage;
  }
  ddp::MpiRuntime mpi(&argc, &argv);
  // Failures are caught while MPI is still up: after start-up a failure on one rank cannot be
  // voted on (the others may be inside a collective), so it ends the whole job.
  try {
    return train_with_mpi(mpi, cli);
  } catch (const ddp::CommTimeout& e) {
    spdlog::error("{}", e.what());
    spdlog::error("aborting the job (exit code {})", kExitTimeout);
    ddp::MpiRuntime::abort(kExitTimeout);
  } catch (const data::DataError& e) {
    // A malformed sample found while training (a loader worker read it): the user's data.
    spdlog::error("{}", e.what());
    spdlog::error("aborting the job (exit code {})", kExitUsage);
    ddp::MpiRuntime::abort(kExitUsage);
  } catch (const memory::OutOfMemoryAbort& e) {
    spdlog::error("{}", e.what());
    spdlog::error("aborting the job (exit code {})", kExitOutOfMemory);
    ddp::MpiRuntime::abort(kExitOutOfMemory);
  } catch (const c10::Error& e) {
    spdlog::error("{}", e.what_without_backtrace());
    spdlog::error("aborting the job (exit code {})", kExitFailure);
    ddp::MpiRuntime::abort(kExitFailure);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    spdlog::error("aborting the job (exit code {})", kExitFailure);
    ddp::MpiRuntime::abort(kExitFailure);
  }
}

int train_with_mpi(ddp::MpiRuntime& mpi, const CommandLine& cli) {
  const int rank = mpi.topology().rank;
  // The first vote uses a fixed deadline: the configured one is not known yet.
  auto bootstrap = mpi.world(std::chrono::seconds(120));

  // Phase 1: launch discovery and configuration.
  LaunchInfo launch;
  Config config;
  int code = agree(*bootstrap, attempt("reading the configuration", [&] {
    launch = resolve_launch(mpi.topology(), process_environment());
    config = load_config(cli.config_path, cli.overrides);
  }));
  if (code != kExitOk) return code;
  setup_logging(rank, launch.world_size, config.log.level);
  if (cli.print_config) {
    if (rank == 0) fmt::print("{}", config_to_yaml(config));
    return kExitOk;
  }

  // Phase 2: devices, data, model, batch plan, the checkpoint to resume from. Its vote waits up
  // to ddp.timeout_s: loading a large data set, or (rank 0 alone) a large checkpoint, can take
  // longer than the fixed start-up deadline.
  const auto timeout = std::chrono::duration<double>(config.ddp.timeout_s);
  auto control = mpi.world(timeout);
  DeviceBinding binding;
  std::string backend;
  std::unique_ptr<data::Dataset> dataset;
  std::shared_ptr<models::Model> model;
  std::optional<train::Checkpoint> checkpoint;
  const int threads = config.train.threads > 0
                          ? static_cast<int>(config.train.threads)
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                            launch.local_size);
  code = agree(*control, attempt("loading the data set and building the model", [&] {
    const auto env = process_environment();
    binding = bind_device(config.train.device, launch.local_rank, launch.local_size,
                          visible_cuda_devices(), env("CUDA_VISIBLE_DEVICES").value_or(""));
    backend = ddp::resolve_backend(config.ddp.backend, binding.device, ddp::nccl_available());
    if (binding.device.is_cuda()) {
      c10::cuda::set_device(binding.device.index());
      if (config.memory.fraction > 0) {
        c10::cuda::CUDACachingAllocator::setMemoryFraction(config.memory.fraction,
                                                           binding.device.index());
      }
    }
    auto& guard = memory::CpuAllocatorGuard::instance();
    guard.set_budget(static_cast<int64_t>(config.memory.cpu_budget_mb * 1048576.0));
    guard.set_injections(launch.rank, memory::parse_injections(config.memory.inject_oom));
    at::set_num_threads(threads);
    dataset = data::make_dataset(config.data);
    // Built here only to be checked: the Trainer (phase 3) builds them again, but its
    // constructor runs collectives, and a user mistake must end at this vote, before any.
    ddp::BatchPlan::make(config.train.global_batch_size, launch.world_size, launch.rank,
                         config.train.micro_batch_size);
    ddp::RankSampler(dataset->size(), config.train.global_batch_size, config.train.seed);
    at::manual_seed(config.train.seed);
    model = models::create_model(config.model, dataset->shape());
    if (!config.checkpoint.dir.empty() && rank == 0) train::check_checkpoint_dir(config.checkpoint.dir);
    if (const auto metrics = train::metrics_path(config.log.metrics, config.checkpoint.dir);
        !metrics.empty() && rank == 0) {
      train::check_metrics_path(metrics);
    }
    if (!config.log.tensorboard.empty() && rank == 0) train::check_tensorboard_dir(config.log.tensorboard);
    // Rank 0 alone reads a checkpoint to resume from; the Trainer broadcasts what it holds.
    const auto& resume = config.checkpoint.resume;
    if (!resume.empty() && rank == 0) {
      std::string path = resume == "auto" ? "" : resume;
      try {
        if (resume == "auto") {
          // The newest checkpoint that verifies; damaged ones are passed over, saying so.
          std::vector<std::string> skipped;
          train::Checkpoint found;
          path = train::newest_good_checkpoint(config.checkpoint.dir, &skipped, &found);
          for (const auto& why : skipped) {
            spdlog::warn("checkpoint.resume: auto: passing over a damaged checkpoint: {}", why);
          }
          if (!path.empty()) checkpoint = std::move(found);
        } else {
          checkpoint = train::read_checkpoint(path);
        }
        if (checkpoint) train::check_compatible(*checkpoint, *model);
      } catch (const train::CheckpointError& e) {
        throw train::CheckpointError(fmt::format("checkpoint.resume: {}", e.what()));
      }
      if (!path.empty()) {
        if (!config.model.init_from.empty()) {
          spdlog::info("model.init_from ignored: resuming from {}", path);
        }
        train::apply_model_state(*checkpoint, *model);
      } else {
        spdlog::info("checkpoint.resume: auto: no checkpoint in {} yet; starting at step 1",
                     config.checkpoint.dir);
      }
    }
  }));
  if (code != kExitOk) return code;

  // Phase 3: communicators and the trainer (parameter check, buckets, broadcast from rank 0).
  std::unique_ptr<ddp::Communicator> data_comm;
  std::unique_ptr<train::Trainer> trainer_ptr;
  code = agree(*control, attempt("setting up the trainer", [&] {
    data_comm = ddp::make_data_communicator(backend, binding.device, *control, timeout);
    train::TrainerOptions options = config.trainer_options();
    options.config_text = config_to_yaml(config);  // recorded in every checkpoint
    trainer_ptr = std::make_unique<train::Trainer>(options, *control, *data_comm, model, *dataset,
                                                   binding.device);
    trainer_ptr->resume(checkpoint ? &*checkpoint : nullptr);
    if (config.train.sample_every > 0 && rank == 0) {
      trainer_ptr->set_sampler(make_training_sampler(model, config, *dataset));
    }
  }));
  if (code != kExitOk) return code;
  train::Trainer& trainer = *trainer_ptr;
  auto* comm = control.get();

  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  const auto hosts = ddp::all_gather_strings(*comm, launch.hostname);
  const auto lines = ddp::all_gather_strings(
      *comm, fmt::format("rank {:>3}  host {}  local rank {}/{}  device {}  threads {}  batch {}",
                         rank, launch.hostname, launch.local_rank, launch.local_size,
                         binding.description, threads, trainer.plan().describe()));
  spdlog::info("trainer 0.1.0 (LibTorch {}), {}: {} rank(s) on {} node(s), backend {}",
               TORCH_VERSION,
               launch.launcher == "none" ? "started without a launcher" : "launched by " + launch.launcher,
               launch.world_size, count_nodes(hosts), data_comm->backend());
  const auto& buckets = trainer.reducer().layout();
  int64_t bucket_bytes = 0;
  for (const auto& b : buckets) bucket_bytes += b.bytes();
  spdlog::info("gradients: {} bucket(s), {:.2f} MiB (first {:.2f} MiB, cap {} MiB)", buckets.size(),
               bucket_bytes / 1048576.0, buckets.empty() ? 0.0 : buckets[0].bytes() / 1048576.0,
               config.ddp.bucket_mb);
  spdlog::info("model {}: {} parameters; dataset {}: {} samples; global batch {}", config.model.name,
               n_params, config.data.dataset, dataset->size(), config.train.global_batch_size);
  for (const auto& line : lines) spdlog::info("{}", line);
  spdlog::info("precision {}; {}", config.train.precision,
               train::apply_device_flags(binding.device, config.train.tf32,
                                         config.train.cudnn_benchmark));
  spdlog::info("memory plan (rank 0): {}",
               trainer.memory_estimate().describe(trainer.plan().micro_batch));
  if (trainer.plan().micro_clamped && config.train.micro_batch_size > 0) {
    spdlog::warn("train.micro_batch_size = {} exceeds this rank's {} samples per step; using {}",
                 config.train.micro_batch_size, trainer.plan().per_rank, trainer.plan().per_rank);
  }
  if (checkpoint) {
    const auto& meta = checkpoint->meta;
    spdlog::info("resumed from {}: {} steps done (written by {} rank(s)); continuing at step {}",
                 checkpoint->path, meta.step, meta.world_size, meta.step + 1);
    if (meta.global_batch_size != config.train.global_batch_size || meta.seed != config.train.seed) {
      spdlog::warn("the checkpoint was written with train.global_batch_size = {} and train.seed = "
                   "{}, this run has {} and {}: the data order differs from the original run's",
                   meta.global_batch_size, meta.seed, config.train.global_batch_size,
                   config.train.seed);
    }
  }
  if (cli.dry_run) {
    spdlog::info("dry run: nothing trained");
    return kExitOk;
  }

  install_stop_handlers();
  // SIGUSR1, the preemption warning, stops the run only when the requeued job would continue
  // from the checkpoint written now; otherwise stopping early would only lose the time left
  // (launcher/signals.h).
  const auto& ckpt = config.checkpoint;
  const bool resumable = !ckpt.dir.empty() && ckpt.resume == "auto";
  bool warned = false;
  const auto stop = [&] {
    if (preemption_warned() && !warned && !terminate_requested()) {
      warned = true;
      if (rank == 0 && resumable) {
        spdlog::warn("SIGUSR1: preemption warning: stopping after this step with a checkpoint in {} "
                     "(exit code {}); the requeued job continues from it (checkpoint.resume: auto)",
                     ckpt.dir, 128 + SIGUSR1);
      } else if (rank == 0) {
        spdlog::warn("SIGUSR1: preemption warning ignored: {}, so a requeued job would start again "
                     "at step 1; training on until the job ends",
                     ckpt.dir.empty() ? "checkpoint.dir is not set"
                                      : "checkpoint.resume is not 'auto'");
      }
    }
    return terminate_requested() || (resumable && preemption_warned());
  };
  train::RunSummary summary;
  try {
    summary = trainer.run(stop);
  } catch (const memory::OutOfMemoryFatal& e) {
    // Every rank throws this after the same vote: a clean, agreed exit.
    if (rank == 0) print_error(0, e.what());
    comm->barrier("out-of-memory exit");
    return kExitOutOfMemory;
  } catch (const train::NonFiniteFatal& e) {
    // Every rank reaches the same verdict from the same reduced gradients: an agreed exit.
    if (rank == 0) print_error(0, e.what());
    comm->barrier("non-finite exit");
    return kExitFailure;
  }
  const int64_t start = trainer.start_step();
  if (summary.steps_done > start) {
    spdlog::info("done: {} steps{}, loss {:.4f} -> {:.4f}, {:.1f} samples/s{}, {} memory fallback(s)",
                 summary.steps_done,
                 start > 0 ? fmt::format(" ({} in this run)", summary.steps_done - start) : "",
                 summary.first_loss, summary.last_loss, summary.samples_per_s,
                 summary.throughput, summary.fallbacks);
  }
  comm->barrier("shutdown");
  if (!summary.stopped) return kExitOk;
  // A preemption warning that came with the last step: the run is complete, nothing to requeue.
  if (stop_signal() == SIGUSR1 && summary.steps_done >= config.train.steps) return kExitOk;
  return 128 + std::max(stop_signal(), 0);
}

}  // namespace
}  // namespace launcher

int main(int argc, char** argv) {
  try {
    return launcher::run(argc, argv);
  } catch (const std::exception& e) {
    // Before or while MPI starts: nothing to agree with yet.
    fmt::print(stderr, "trainer: error: {}\n", e.what());
    return launcher::kExitFailure;
  }
}
