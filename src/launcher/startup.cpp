#include "launcher/startup.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <thread>

#include <malloc.h>

#include "checkpoint/files.h"
#include "data/choice_tasks.h"
#include "data/registry.h"
#include "data/tokenizer.h"
#include "ddp/backend.h"
#include "ddp/batch_plan.h"
#include "ddp/errors.h"
#include "ddp/nccl_communicator.h"
#include "ddp/rank_sampler.h"
#include "ddp/shard.h"
#include "launcher/exit_codes.h"
#include "launcher/exit_status.h"
#include "launcher/generate_command.h"
#include "launcher/logging.h"
#include "launcher/no_data.h"
#include "launcher/resume.h"
#include "memory/allocator_guard.h"
#include "memory/memory_stats.h"
#include "models/capabilities.h"
#include "models/deferred_init.h"
#include "models/language_model.h"
#include "models/registry.h"
#include "train/loop.h"
#include "train/precision.h"
#include "train/reference_logps.h"
#include "train/report/metrics.h"
#include "train/report/tensorboard.h"
#include "train/text_samples.h"

namespace launcher {
namespace {

// Every rank learns whether any rank failed. Rank 0 prints its own error; a failing rank prints
// its error only when rank 0 had none (then it is news). Returns the exit code all ranks use.
int agree(ddp::Communicator& comm, const ExitStatus& mine) {
  at::Tensor vote = at::tensor({mine.code, comm.rank() == 0 ? mine.code : 0}, at::kInt);
  comm.all_reduce(vote, ddp::ReduceOp::kMax, "start-up vote");
  const int code = vote[0].item<int>();
  const bool rank0_failed = vote[1].item<int>() != 0;
  if (mine.code != kExitOk && (comm.rank() == 0 || !rank0_failed))
    print_error(comm.rank(), mine.message);
  return code;
}

// Runs one start-up phase of this rank; `doing` names it in an out-of-memory message.
ExitStatus attempt(const char* doing, const std::function<void()>& fn) {
  try {
    fn();
    return {};
  } catch (const std::exception& e) {
    return *exit_status(startup_rules(), e, doing);  // the table ends with std::exception
  }
}

// The device, the data plane's backend, the memory limits and the CPU threads of this rank.
void bind_rank(Startup& s) {
  const config::Config& config = s.config;
  const auto env = process_environment();
  s.binding = bind_device(config.train.device, s.launch.local_rank, s.launch.local_size,
                          visible_cuda_devices(), env("CUDA_VISIBLE_DEVICES"));
  s.backend = ddp::resolve_backend(config.ddp.backend, s.binding.device, ddp::nccl_available());
  use_device(s.binding.device, config.memory, s.launch.rank, s.launch.local_size);
  at::set_num_threads(s.threads);
}

// The bytes each id of `tokenizer` stands for inside a text, int64 [vocab] (bits per byte): after
// itself, so that a SentencePiece-style token's leading space counts, which a text's first token
// loses; ids it does not spell count 0.
at::Tensor token_bytes(const data::Tokenizer& tokenizer, int64_t vocab) {
  at::Tensor bytes = at::zeros({vocab}, at::kLong);
  auto b = bytes.accessor<int64_t, 1>();
  const int64_t spelled = std::min(vocab, tokenizer.vocab_size());
  for (int64_t id = 0; id < spelled; ++id) {
    b[id] = static_cast<int64_t>(data::decode_continuation(tokenizer, {id}, {id}).size());
  }
  return bytes;
}

// eval.tasks (read and checked on every rank alike) and the token bytes of bits per byte, for
// language models on token data.
void load_eval_inputs(Startup& s) {
  const config::Config& config = s.config;
  const auto* lm = models::as<models::LanguageModel>(*s.model);
  const auto& tasks = config.train.eval_tasks;
  if (!tasks.empty() && lm == nullptr) {
    throw std::invalid_argument(fmt::format(
        "eval.tasks: multiple-choice tasks need a language model (model.name: gpt or llama); "
        "this config has model.name: {}",
        config.model.name));
  }
  if (lm == nullptr || config.data.dataset != "tokens") return;
  const bool needs_tokenizer = std::any_of(
      tasks.begin(), tasks.end(), [](const std::string& t) { return !t.ends_with(".bin"); });
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::choose_tokenizer(config.data, config.model.init_from);
  } catch (const std::invalid_argument&) {
    if (needs_tokenizer) throw;  // JSON Lines tasks need one; bits per byte goes without
  }
  for (const std::string& path : tasks) {
    s.eval_inputs.tasks.push_back(
        data::read_choice_task(path, tokenizer.get(), lm->vocab_size(), lm->context()));
    if (s.rank == 0 && path.ends_with(".bin") && tokenizer && tokenizer->name() != "gpt2") {
      spdlog::warn("eval.tasks: {} holds GPT-2 ids (llm.c's format), and this run's tokenizer is "
                   "{}: its scores mean something only if the model reads GPT-2 ids",
                   path, tokenizer->name());
    }
  }
  if (tokenizer) s.eval_inputs.token_bytes = token_bytes(*tokenizer, lm->vocab_size());
}

// Rank 0: the directories and files the run writes, checked (and created) so that a typo stops
// the job now rather than at its first checkpoint; a training run then locks them
// (launcher/run_lock.h): a second run into them stops here, before it reads any data.
void check_outputs(Startup& s) {
  const config::Config& config = s.config;
  if (s.rank != 0) return;
  if (!config.checkpoint.dir.empty()) checkpoint::check_checkpoint_dir(config.checkpoint.dir);
  const auto metrics = train::metrics_path(config.log.metrics, config.checkpoint.dir);
  if (!metrics.empty()) train::check_metrics_path(metrics);
  if (!config.log.tensorboard.empty()) train::check_tensorboard_dir(config.log.tensorboard);
  if (!s.writes_outputs) return;  // --evaluate, --dry-run: they only read (no lock, no wait)
  RunLock::Options options;
  // Within start-up's vote deadline (the other ranks wait in it meanwhile).
  options.same_job_grace =
      std::min(options.same_job_grace, std::chrono::duration<double>(config.ddp.timeout_s / 2));
  if (const auto grace = process_environment()("TRAINER_TEST_LOCK_GRACE_S")) {
    options.same_job_grace = std::chrono::duration<double>(std::stod(*grace));  // tests only
  }
  s.outputs =
      RunLock::take(output_places(config.checkpoint.dir, metrics, config.log.tensorboard),
                    LockHolder::this_process(s.launch.hostname, process_environment()), options);
  for (const std::string& note : s.outputs->notes()) spdlog::info("{}", note);
}

// Whether the model is built without storage: a language model under ddp.shard: parameters
// that a Trainer will shard (a run with data); with LoRA adapters their frozen base too (sharded
// with its units: ddp::ReducerOptions::frozen), and model.lora_init_from's adapters read into
// each rank's blocks (models::DeferredRecord::read_adapters). `under`: the ddp.shard mode asked
// about (the config's, unless stated).
bool builds_deferred(const Startup& s, std::optional<ddp::ShardMode> under = std::nullopt) {
  const config::Config& c = s.config;
  return models::builds_without_storage(c.model.name) &&
         under.value_or(c.ddp.shard) == ddp::ShardMode::kParameters && s.dataset != nullptr;
}

// The plan before a whole build (docs/DESIGN.md, "The OOM protocol", point 1): a model that
// ddp.shard: parameters would build without storage, built whole on every rank under the mode in
// force, must fit the host memory this rank plans with (memory.cpu_budget_mb, or the machine's)
// beside what it holds already (the data set). If it does not, it is refused here, before the
// build could run out of memory, naming parameters, which keeps 1/N of it per rank. The size comes
// from the same model built without storage (no bytes). Local: every rank decides alike from the
// same config, and the start-up vote makes it one exit.
void check_whole_build(const Startup& s) {
  const config::Config& c = s.config;
  if (builds_deferred(s) || !builds_deferred(s, ddp::ShardMode::kParameters)) return;
  const memory::MemorySample host = memory::sample_memory(c10::Device(c10::kCPU));
  if (host.total_bytes <= 0) return;
  std::shared_ptr<models::Model> sizes;
  {
    const models::DeferredInit deferred(c10::Device(c10::kCPU));
    sizes = models::create_model(c.model, s.dataset->shape());
  }
  int64_t whole = 0;
  for (const auto& p : sizes->parameters()) whole += p.nbytes();
  for (const auto& b : sizes->buffers()) whole += b.nbytes();
  if (host.tensor_bytes + whole <= host.total_bytes) return;
  const int shards =
      c.ddp.shard_group == ddp::ShardGroup::kNode ? s.launch.local_size : s.launch.world_size;
  const int64_t share = whole / shards;
  throw ddp::PlanError(fmt::format(
      "model {} ({} of parameters and buffers) cannot be built whole on every rank under "
      "ddp.shard: {}: it needs {} of the {} each rank plans with ({}){}; {}",
      c.model.name, memory::mib_text(whole), ddp::to_string(c.ddp.shard),
      memory::mib_text(host.tensor_bytes + whole), memory::mib_text(host.total_bytes),
      memory::CpuAllocatorGuard::instance().budget_bytes() > 0 ? "memory.cpu_budget_mb"
                                                               : "the machine's memory",
      host.tensor_bytes > 0
          ? fmt::format(", with the {} it holds already", memory::mib_text(host.tensor_bytes))
          : "",
      host.tensor_bytes + share <= host.total_bytes
          ? fmt::format("ddp.shard: parameters builds it without storage and keeps 1/{} of it "
                        "({}) on each rank, and two units in a step: set ddp.shard: parameters "
                        "(--set ddp.shard=parameters), or give each rank more memory",
                        shards, memory::mib_text(share))
          : fmt::format("even its 1/{} share under ddp.shard: parameters ({}) does not fit: run "
                        "more ranks, give each rank more memory, or use a smaller model",
                        shards, memory::mib_text(share))));
}

// The data set and the model, and the checks that must fail here rather than in the Trainer.
void load_data_and_model(Startup& s) {
  const config::Config& config = s.config;
  s.no_data = missing_validation_data(config, s.weights_only);
  if (s.plan_only) {  // planned from the shapes: no data, no weights (a login node)
    models::DeferredInit deferred(s.binding.device);
    s.model = models::create_model(config.model, shape_without_data(config));
    s.model->set_deferred_init(deferred.finish(*s.model));
    return;
  }
  if (s.no_data.empty()) {
    s.dataset = data::make_dataset(config.data);
    if (const auto packing = s.dataset->packing(); packing && s.rank == 0) {
      spdlog::info("{}", data::packing_line(*packing));  // the windows' efficiency, documents split
    }
    // Built here only to be checked: the Trainer (phase 3) builds them again, but its
    // constructor runs collectives, and a user mistake must end at this vote, before any.
    ddp::BatchPlan::make(config.train.global_batch_size, s.launch.world_size, s.launch.rank,
                         config.train.micro_batch_size);
    ddp::RankSampler(s.dataset->size(), config.train.global_batch_size, config.train.seed);
  }
  check_whole_build(s);
  at::manual_seed(config.train.seed);
  // ddp.shard: parameters: a language model is built without storage, and each rank fills only
  // its blocks, unit by unit (models/deferred_init.h, train/model_state.h).
  std::optional<models::DeferredInit> deferred;
  if (builds_deferred(s)) deferred.emplace(s.binding.device);
  s.model = models::create_model(config.model,
                                 s.dataset ? s.dataset->shape() : shape_without_data(config));
  if (deferred) s.model->set_deferred_init(deferred->finish(*s.model));
  load_eval_inputs(s);
  if (s.rank != 0) return;
  // Rank 0 alone chooses the checkpoint to resume from and loads the model's tensors; the
  // Trainer broadcasts the model, and the moments (a single file) or the path of a sharded
  // checkpoint, whose files every rank then reads its own moments from (Checkpointer::resume).
  try {
    s.resume_from = select_resume(config.checkpoint, *s.model,
                                  s.weights_only ? ResumeFor::kWeights : ResumeFor::kTraining,
                                  config.train.optimizer);
  } catch (const checkpoint::CheckpointError& e) {
    if (s.dataset) throw;
    throw checkpoint::CheckpointError(e.what() + without_data_hint(config));
  }
  if (s.resume_from && !config.model.init_from.empty()) {
    if (s.resume_from->meta.adapters_only()) {  // LoRA: the checkpoint holds the adapters only
      spdlog::info("model.init_from {}: the frozen base; its adapters and their optimizer state "
                   "from {}",
                   config.model.init_from, s.resume_from->path);
    } else {
      spdlog::info("model.init_from ignored: resuming from {}", s.resume_from->path);
    }
  }
}

// --evaluate with eval.tasks looked for its data on every rank (load_data_and_model): a job whose
// ranks did not all find the same (data.path on storage some nodes lack) stops with exit 2 here,
// instead of issuing different collectives. Collective: one all-reduce, issued by every rank of
// such a run (the condition is the configuration's).
int agree_on_data(Startup& s) {
  if (!s.weights_only || s.config.train.eval_tasks.empty()) return kExitOk;
  const bool has = s.dataset != nullptr;
  at::Tensor found = at::tensor({has ? 1 : 0, has ? 0 : 1}, at::kInt);
  s.control->all_reduce(found, ddp::ReduceOp::kMax, "data agreement");
  if (found[0].item<int>() == 0 || found[1].item<int>() == 0) return kExitOk;
  return agree(*s.control, attempt("checking the data", [&] {
    throw LaunchError(fmt::format(
        "--evaluate: data.path '{}' is found by some ranks and not by others (rank {}: {}); give "
        "every rank the same data, or none",
        s.config.data.path, s.rank, has ? "found" : s.no_data));
  }));
}

// ddp.shard_group: node needs every node to run the same number of ranks: otherwise every rank
// stops here (exit 2) with each node's size. Collective over the world when it refuses.
int check_node_layout(const ddp::MpiTopology& t, Startup& s) {
  if (s.config.ddp.shard_group != ddp::ShardGroup::kNode || t.uniform_nodes) return kExitOk;
  at::Tensor sizes = at::empty({t.world_size}, at::kInt);
  s.bootstrap->all_gather(sizes, at::tensor({t.node_rank == 0 ? t.node_size : 0}, at::kInt),
                          "node sizes");
  std::vector<std::string> nodes;
  for (int r = 0; r < t.world_size; ++r) {
    const int n = sizes[r].item<int>();
    if (n > 0) nodes.push_back(fmt::format("{} (from rank {})", n, r));
  }
  return agree(*s.bootstrap, attempt("checking the node layout", [&] {
    throw LaunchError(fmt::format(
        "ddp.shard_group: 'node' needs every node to run the same number of ranks, and the "
        "nodes run {} ranks; launch the same number of ranks per node or set ddp.shard_group: "
        "world",
        fmt::join(nodes, ", ")));
  }));
}

}  // namespace

int read_configuration(ddp::MpiRuntime& mpi, const std::string& config_path,
                       const std::vector<std::string>& overrides, Startup& s) {
  s.rank = mpi.topology().rank;
  s.bootstrap = mpi.world(std::chrono::seconds(120));
  const int code = agree(*s.bootstrap, attempt("reading the configuration", [&] {
    s.launch = resolve_launch(mpi.topology(), process_environment());
    s.config = config::load_config(config_path, overrides);
  }));
  if (code != kExitOk) return code;
  setup_logging(s.rank, s.launch.world_size, s.config.log.level);
  return check_node_layout(mpi.topology(), s);
}

int prepare(ddp::MpiRuntime& mpi, Startup& s) {
  const std::chrono::duration<double> timeout(s.config.ddp.timeout_s);
  s.control = mpi.world(timeout);
  if (s.config.ddp.shard_group == ddp::ShardGroup::kNode) {
    s.node_control = mpi.node(timeout);
    s.cross_control = mpi.cross_node(timeout);
  }
  const auto progress = s.config.ddp.mpi_progress;
  if (ddp::mpi_progress_thread(progress, s.config.ddp.shard, s.launch.world_size)) {
    if (!mpi.start_progress_thread(
            std::chrono::microseconds(static_cast<int64_t>(s.config.ddp.mpi_poll_us)))) {
      if (s.rank == 0) {
        spdlog::warn("ddp.mpi_progress = {}: MPI did not provide MPI_THREAD_MULTIPLE; the "
                     "training thread drives MPI operations itself",
                     ddp::kMpiProgressModeNames.at(static_cast<size_t>(progress)));
      }
    } else if (progress == ddp::MpiProgressMode::kAuto && s.rank == 0) {
      spdlog::info("ddp.mpi_progress = auto: a progress thread moves posted MPI operations "
                   "(ddp.shard: parameters prefetches unit gathers)");
    }
  }
  s.cpus = bind_cpus(s.launch.local_rank, s.launch.local_size, s.config.train.threads);
  s.threads = s.cpus.threads;
  // A model built whole on every rank that does not fit: name the mode that builds it without
  // storage (gpt, llama).
  const char* doing =
      s.config.ddp.shard == ddp::ShardMode::kParameters
          ? "loading the data set and building the model"
          : "loading the data set and building the model whole on every rank (ddp.shard: "
            "parameters builds a gpt or llama without storage, 1/N of it per rank)";
  const int code = agree(*s.control, attempt(doing, [&] {
    bind_rank(s);
    check_outputs(s);
    load_data_and_model(s);
  }));
  return code != kExitOk ? code : agree_on_data(s);
}

// Without data (--evaluate scoring eval.tasks only) there is no Trainer: rank 0's weights (the
// checkpoint it read) go to every rank, as the Trainer's broadcast would send them, on the control
// communicator, and the model to the device.
int place_model(Startup& s) {
  return agree(*s.control, attempt("placing the model", [&] {
    at::NoGradGuard no_grad;
    for (auto& item : s.model->named_parameters()) {
      s.control->broadcast(item.value().data(), 0, "parameter " + item.key());
    }
    for (auto& item : s.model->named_buffers()) {
      s.control->broadcast(item.value(), 0, "buffer " + item.key());
    }
    s.model->to(s.binding.device);
  }));
}

int build_trainer(Startup& s) {
  if (!s.dataset) {
    const int code = place_model(s);
    if (code == kExitOk) {
      s.device_flags = train::apply_device_flags(s.binding.device, s.config.train.tf32,
                                                 s.config.train.cudnn_benchmark);
    }
    return code;
  }
  const int code = agree(*s.control, attempt("setting up the trainer", [&] {
    const std::chrono::duration<double> timeout(s.config.ddp.timeout_s);
    s.data_comm = ddp::make_data_communicator(s.backend, s.binding.device, *s.control, timeout);
    train::HybridComms hybrid;
    if (s.node_control) {  // ddp.shard_group: node; in this order on every rank
      s.node_data =
          ddp::make_data_communicator(s.backend, s.binding.device, *s.node_control, timeout);
      s.cross_data =
          ddp::make_data_communicator(s.backend, s.binding.device, *s.cross_control, timeout);
      hybrid = {s.node_data.get(), s.cross_data.get()};
    }
    train::TrainerOptions options = s.config.trainer_options();
    s.trainer = std::make_unique<train::Trainer>(options, *s.control, *s.data_comm, s.model,
                                                 *s.dataset, s.binding.device, hybrid);
    s.checkpointer = train::make_checkpointer(*s.trainer, config::config_to_yaml(s.config));
    s.eval_inputs.objective = &s.trainer->objective();  // validation as training scores it
    // Before resume: without one the model holds the initial weights (the reference of dpo).
    train::prepare_reference(*s.trainer, s.config.checkpoint.dir,
                             s.resume_from ? s.resume_from->path : std::string());
    s.start_step =
        train::resume(*s.checkpointer, *s.trainer, s.resume_from ? &*s.resume_from : nullptr);
    if (s.resume_from) {  // applied: rank 0 keeps its path and step, not a copy of the state
      s.resume_from->tensors.clear();
      s.resume_from->manifest.reset();
      ::malloc_trim(0);  // the freed heap pages back to the system, not only to malloc
    }
    if (s.config.train.sample_every > 0) {  // every rank: collective under parameters
      std::function<std::string()> sampler;
      if (s.rank == 0) {
        sampler = train::make_text_sampler(
            s.model, s.config.model.name,
            data::choose_tokenizer(s.config.data, s.config.model.init_from), s.config.train,
            *s.dataset);
      }
      s.actions.push_back(train::text_sample_action(
          s.config.train.sample_every, std::move(sampler),
          [trainer = s.trainer.get()] { return trainer->units_in_step(); }));
    }
  }));
  if (code == kExitOk) {
    s.device_flags = train::apply_device_flags(s.binding.device, s.config.train.tf32,
                                               s.config.train.cudnn_benchmark);
  }
  return code;
}

}  // namespace launcher
