// trainer: the command line, and the only place that decides to exit. One rank's run, in named
// steps: start-up in voted phases (launcher/startup.h, with the resume selection of
// launcher/resume.h), the banner (launcher/banner.h), training under the stop policy
// (launcher/stop_policy.h). Every error becomes an exit code through one table
// (launcher/exit_status.h).

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"
#include "ddp/errors.h"
#include "ddp/mpi_runtime.h"
#include "ddp/nccl_communicator.h"
#include "launcher/banner.h"
#include "launcher/dry_run_plan.h"
#include "launcher/evaluate_tasks.h"
#include "launcher/exit_codes.h"
#include "launcher/exit_status.h"
#include "launcher/failure_file.h"
#include "launcher/generate_command.h"
#include "launcher/launch.h"
#include "launcher/signals.h"
#include "launcher/startup.h"
#include "launcher/stop_policy.h"
#include "memory/process_memory.h"
#include "models/registry.h"
#include "train/evaluation.h"
#include "train/loop.h"
#include "train/report/run_report.h"

namespace launcher {
namespace {

struct CommandLine {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  bool dry_run = false;
  bool help_config = false;
  bool generate = false;  // --generate PROMPT (launcher/generate_command.h)
  GenerateArgs generate_args;
  std::string export_hf;     // --export-hf DIR
  ExportHfArgs export_args;  // --max-shard-size, --export-dtype
  std::string export_peft;   // --export-peft DIR
  std::string consolidate;   // --consolidate DIR
  bool force = false;        // --force: the three above may write over what exists
  bool evaluate = false;     // --evaluate: the evaluations only, then exit
  // --dry-run --plan-ranks N --plan-device-memory SIZE [--plan-ranks-per-node M]
  // (launcher/dry_run_plan.h); 0: not asked.
  int plan_ranks = 0;
  int plan_ranks_per_node = 0;
  std::string plan_device_memory;
  int64_t plan_device_bytes = 0;
  bool planning() const { return plan_ranks > 0; }
};

// --generate PROMPT (or --generate --chat QUESTION) and the options that only it takes; returns
// --generate's option.
CLI::Option* add_generate_options(CLI::App& app, GenerateArgs& g) {
  auto* generate = app.add_option("--generate", g.prompt,
                                  "write PROMPT and a continuation from the config's weights, exit")
                       ->expected(0, 1);
  app.add_option("--chat", g.chat,
                 "--generate: the reply to QUESTION as a user's turn in the chat template of "
                 "the data's chat.json")
      ->needs(generate);
  app.add_option("--max-new-tokens", g.max_new_tokens, "--generate: tokens to add")
      ->check(CLI::NonNegativeNumber)
      ->needs(generate);
  app.add_option("--temperature", g.temperature, "--generate: sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->needs(generate);
  app.add_option("--top-k", g.top_k, "--generate: sample among the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->needs(generate);
  app.add_option("--seed", g.seed, "--generate: sampling seed")->needs(generate);
  return generate;
}

// The commands that write the config's weights elsewhere, and --evaluate: each excludes the
// others and --generate.
void add_export_options(CLI::App& app, CommandLine& cli, CLI::Option* generate) {
  auto* export_hf = app.add_option("--export-hf", cli.export_hf,
                                   "write the config's weights as a Hugging Face GPT-2 or Llama "
                                   "(config.json, model.safetensors) to DIR, exit")
                        ->excludes(generate);
  auto* export_peft =
      app.add_option("--export-peft", cli.export_peft,
                     "write the adapters of a LoRA run (model.lora_rank) as a PEFT adapter "
                     "(adapter_config.json, adapter_model.safetensors) to DIR, exit")
          ->excludes(generate)
          ->excludes(export_hf);
  app.add_option("--consolidate", cli.consolidate,
                 "write the sharded checkpoint directory DIR (checkpoint.format: sharded) as one "
                 "checkpoint file, DIR.safetensors, exit")
      ->excludes(generate)
      ->excludes(export_hf)
      ->excludes(export_peft);
  app.add_flag("--force", cli.force,
               "--consolidate, --export-hf, --export-peft: write over an existing file or a "
               "directory that is not empty (without it: exit 2 naming it)");
  app.add_flag("--evaluate", cli.evaluate,
               "run only the evaluations (validation loss and bits per byte, eval.tasks) on the "
               "weights --generate would use, on one process or under mpirun, and exit")
      ->excludes(generate)
      ->excludes(export_hf)
      ->excludes(export_peft);
  app.add_option("--max-shard-size", cli.export_args.max_shard_size,
                 "--export-hf: weights above this go to shards and an index, as "
                 "save_pretrained (5GB, 500MB, 2GiB, bytes)")
      ->needs(export_hf);
  app.add_option("--export-dtype", cli.export_args.dtype,
                 "--export-hf: store the weights in this dtype and declare it in config.json "
                 "(default: stored float32, declared as train.precision)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->needs(export_hf);
}

// --dry-run and its planning options (--plan-ranks without the devices).
void add_plan_options(CLI::App& app, CommandLine& cli) {
  auto* dry_run = app.add_flag("--dry-run", cli.dry_run,
                               "print the plan (ranks, devices, batches, model) and exit");
  auto* plan_ranks =
      app.add_option("--plan-ranks", cli.plan_ranks,
                     "--dry-run: plan for N ranks of --plan-device-memory each, without the "
                     "devices (one process, e.g. on a login node)")
          ->check(CLI::PositiveNumber)
          ->needs(dry_run);
  app.add_option("--plan-device-memory", cli.plan_device_memory,
                 "--dry-run: the memory of one planned device (80GiB, 80GB, 81920MiB, bytes)")
      ->needs(dry_run)
      ->needs(plan_ranks);
  plan_ranks->needs(app.get_option("--plan-device-memory"));
  app.add_option("--plan-ranks-per-node", cli.plan_ranks_per_node,
                 "--plan-ranks: the ranks on each planned node, a divisor of N (needed under "
                 "ddp.shard_group: node, whose shards span one node)")
      ->check(CLI::PositiveNumber)
      ->needs(plan_ranks);
}

int parse_command_line(int argc, char** argv, CommandLine& cli) {
  CLI::App app{"trainer: data-parallel training with LibTorch over NCCL and MPI.\n"
               "Start one process per GPU: mpirun -np 8 trainer --config run.yaml"};
  app.add_option("--config", cli.config_path, "YAML run configuration")->check(CLI::ExistingFile);
  app.add_option("--set", cli.overrides, "override a key: --set section.key=value (repeatable)")
      ->take_all();
  app.add_flag("--print-config", cli.print_config, "print the effective configuration and exit");
  add_plan_options(app, cli);
  app.add_flag("--help-config", cli.help_config, "list every config key with type, default, range");
  CLI::Option* generate = add_generate_options(app, cli.generate_args);
  add_export_options(app, cli, generate);
  app.set_version_flag(
      "--version", fmt::format("trainer 0.1.0 (LibTorch {}; {})", TORCH_VERSION, ddp::gpu_build()));
  const bool speaks = launcher_rank(process_environment()) == 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      if (speaks) app.exit(e);
      return kExitOk + 1000;  // printed help or version: done
    }
    if (speaks)
      fmt::print(stderr, "trainer: error: {}\nRun 'trainer --help' for usage.\n", e.what());
    return kExitUsage;
  }
  cli.generate = generate->count() > 0;
  cli.export_args.force = cli.force;
  if (cli.force && cli.export_hf.empty() && cli.export_peft.empty() && cli.consolidate.empty()) {
    if (speaks)
      fmt::print(stderr, "trainer: error: --force goes with --consolidate, --export-hf or "
                         "--export-peft\nRun 'trainer --help' for usage.\n");
    return kExitUsage;
  }
  if (cli.planning()) {
    try {
      cli.plan_device_bytes = parse_device_memory(cli.plan_device_memory, "--plan-device-memory");
    } catch (const std::invalid_argument& e) {
      if (speaks) fmt::print(stderr, "trainer: error: {}\n", e.what());
      return kExitUsage;
    }
  }
  if (cli.help_config) {
    if (speaks) fmt::print("{}", config::config_reference());
    return kExitOk + 1000;
  }
  if (cli.config_path.empty()) {
    if (speaks)
      fmt::print(stderr,
                 "trainer: error: --config FILE is required\nRun 'trainer --help' for usage.\n");
    return kExitUsage;
  }
  return kExitOk;
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
  if (!cli.export_hf.empty())
    return run_export_hf(cli.config_path, cli.overrides, cli.export_hf, cli.export_args);
  if (!cli.export_peft.empty())
    return run_export_peft(cli.config_path, cli.overrides, cli.export_peft, cli.force);
  if (!cli.consolidate.empty())
    return run_consolidate(cli.config_path, cli.overrides, cli.consolidate, cli.force);
  try {
    check_launch_before_mpi(process_environment());
  } catch (const LaunchError& e) {
    // Every task finds the same: the first one speaks for the job.
    const ExitStatus status = *exit_status(startup_rules(), e);
    if (launcher_rank(process_environment()) == 0) print_error(0, status.message);
    return status.code;
  }
  ddp::MpiRuntime mpi(&argc, &argv);
  // Failures are caught while MPI is still up: after start-up a failure on one rank cannot be
  // voted on (the others may be inside a collective), so it ends the whole job.
  try {
    return train_with_mpi(mpi, cli);
  } catch (const std::exception& e) {
    const ExitStatus status = *exit_status(abort_rules(), e);  // the table ends with std::exception
    spdlog::error("{}", status.message);
    write_failure_file(e, status.code);
    spdlog::error("aborting the job (exit code {})", status.code);
    ddp::MpiRuntime::abort(status.code);
  }
}

// Trains until train.steps, a stop signal (launcher/stop_policy.h) or an agreed failure; the exit
// code all ranks end with.
int train_until_done(Startup& s) {
  install_stop_handlers();
  StopPolicy policy(s.rank, s.config.checkpoint);
  train::TrainingLoop loop(*s.trainer, *s.checkpointer, std::move(s.eval_inputs), s.start_step);
  for (auto& action : s.actions) loop.add(std::move(action));
  train::RunSummary summary;
  try {
    summary = loop.run([&policy] { return policy.stop_requested(); });
  } catch (const std::exception& e) {
    const auto agreed = exit_status(agreed_run_rules(), e);
    if (!agreed) throw;  // one rank's failure: run() aborts the job
    if (s.rank == 0) print_error(0, agreed->message);
    s.control->barrier(agreed->barrier);
    return agreed->code;
  }
  if (summary.steps_done > s.start_step) {
    // Throughput of the training steps; periodic actions' time is reported apart, per bucket.
    spdlog::info("{}", train::done_line(summary, s.start_step));
  }
  int signal = 0;
  if (summary.stopped) {
    signal = agree_on_stop_signal(*s.control, stop_signal());
    policy.stopped(signal, summary.steps_done, s.config.train.steps);
  }
  s.control->barrier("shutdown");
  return exit_code_after_run(summary.stopped, signal, summary.steps_done, s.config.train.steps);
}

// --evaluate: the evaluation a run does at train.eval_every, once, on the weights --generate
// would use (checkpoint.resume, the newest checkpoint in checkpoint.dir, model.init_from). Every
// rank evaluates its slice; rank 0 prints the lines.
int evaluate_only(Startup& s) {
  if (s.rank == 0) {
    spdlog::info("evaluating {}",
                 s.resume_from ? fmt::format("checkpoint {} ({} steps done)", s.resume_from->path,
                                             s.resume_from->meta.step)
                 : !s.config.model.init_from.empty()
                     ? fmt::format("model.init_from {}", s.config.model.init_from)
                     : std::string("the untrained model (no checkpoint, no model.init_from)"));
  }
  if (!s.trainer) return evaluate_tasks_only(s);  // no data: eval.tasks only
  train::Trainer& t = *s.trainer;
  const auto units = t.units_in_step();  // ddp.shard: parameters: one unit at a time
  const train::ValidationMetrics m =
      train::evaluate_and_log(t.control(), t.model(), t.dataset(), s.start_step,
                              t.plan().micro_batch, s.config.train.eval_samples, s.eval_inputs);
  if (units) units->finish();
  if (s.rank == 0 && m.samples == 0 && m.tasks.empty()) {
    spdlog::warn("--evaluate: nothing to evaluate (no validation split, no eval.tasks)");
  }
  s.control->barrier("shutdown");
  return kExitOk;
}

// --dry-run --plan-ranks of a language model (launcher/dry_run_plan.h, log_shape_plan).
int plan_from_shapes(const Startup& s, const PlannedWorld& planned, int64_t device_bytes) {
  try {
    log_shape_plan(s, planned, device_bytes);
  } catch (const ddp::PlanError& e) {
    print_error(0, e.what());
    return kExitUsage;
  }
  spdlog::info("dry run: nothing trained");
  return kExitOk;
}

int train_with_mpi(ddp::MpiRuntime& mpi, const CommandLine& cli) {
  Startup s;
  s.weights_only = cli.evaluate;
  s.writes_outputs = !cli.evaluate && !cli.dry_run;  // the others only read: they take no lock
  std::vector<std::string> overrides = cli.overrides;
  if (cli.planning()) {
    if (mpi.topology().world_size > 1) {
      if (mpi.topology().rank == 0) {
        print_error(0, fmt::format("--plan-ranks plans {} ranks from one process: run it without "
                                   "mpirun (this job has {} ranks)",
                                   cli.plan_ranks, mpi.topology().world_size));
      }
      return kExitUsage;
    }
    // The planned devices and their NCCL are not here: this one process plans on the CPU.
    overrides.push_back("train.device=cpu");
    overrides.push_back("ddp.backend=mpi");
  }
  if (const int code = read_configuration(mpi, cli.config_path, overrides, s); code != kExitOk) {
    return code;
  }
  const PlannedWorld planned{cli.plan_ranks, cli.plan_ranks_per_node, s.config.ddp.shard_group};
  if (cli.planning()) {
    try {
      plan_shard_ranks(planned);  // before the model is built: a flag the plan cannot use
    } catch (const ddp::PlanError& e) {
      print_error(0, e.what());
      return kExitUsage;
    }
  }
  if (cli.print_config) {
    if (s.rank == 0) fmt::print("{}", config::config_to_yaml(s.config));
    return kExitOk;
  }
  // A language model is planned from its shapes: no data, no weights, no Trainer.
  const auto lms = models::language_model_names();
  s.plan_only =
      cli.planning() && std::find(lms.begin(), lms.end(), s.config.model.name) != lms.end();
  if (const int code = prepare(mpi, s); code != kExitOk) return code;
  if (s.plan_only) return plan_from_shapes(s, planned, cli.plan_device_bytes);
  if (const int code = build_trainer(s); code != kExitOk) return code;
  log_banner(s);
  if (cli.dry_run) {
    if (cli.planning()) {
      try {
        log_device_plan(s, planned, cli.plan_device_bytes);
      } catch (const ddp::PlanError& e) {
        print_error(0, e.what());
        return kExitUsage;
      }
    }
    spdlog::info("dry run: nothing trained");
    return kExitOk;
  }
  if (cli.evaluate) return evaluate_only(s);
  arm_failure_file(*s.control, s.rank, s.launch.hostname, s.config.checkpoint.dir);
  return train_until_done(s);
}

}  // namespace
}  // namespace launcher

int main(int argc, char** argv) {
  memory::keep_freed_memory_for_reuse();  // before any thread allocates (memory/process_memory.h)
  try {
    return launcher::run(argc, argv);
  } catch (const std::exception& e) {
    // Before or while MPI starts: nothing to agree with yet (the start-up table, unvoted).
    const auto status = *launcher::exit_status(launcher::startup_rules(), e, "starting");
    launcher::print_error(0, status.message);
    return status.code;
  }
}
