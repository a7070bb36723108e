// Start-up of one rank: what runs between MPI_Init and the first step, in three phases.
//
// Each phase ends with a vote over MPI (every rank learns whether any rank failed), so a user
// mistake seen on any rank ends every rank with the exit code of launcher/exit_status.h's start-up
// table and one message, and no rank is left waiting in a collective. A phase returns that exit
// code: kExitOk to go on.
//
// 1. read_configuration: launch discovery and the config file (a fixed 120 s deadline: the
//    configured one is not known yet).
// 2. prepare: devices, memory limits, (rank 0) a check of the output directories and, for a
//    training run, their lock (launcher/run_lock.h: a second run into them stops here), data,
//    model, the tasks of eval.tasks (each rank reads and checks them: data/choice_tasks.h), a
//    check of the batch plan, and (rank 0) the checkpoint to resume from (launcher/resume.h). Its
//    vote waits up to ddp.timeout_s: loading a large data set or checkpoint can take longer than
//    120 s. --evaluate with eval.tasks and no data (launcher/evaluate_tasks.h) builds the model
//    without a data set; then every rank checks that every rank found the same (a vote).
// 3. build_trainer: the data-plane communicator and the Trainer (parameter check, buckets, the
//    broadcast from rank 0); then the device's math flags (train.tf32, train.cudnn_benchmark).
//    Without data there is no Trainer: rank 0's weights are broadcast and the model is moved to
//    the device (launcher/evaluate_tasks.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "data/dataset.h"
#include "ddp/communicator.h"
#include "ddp/mpi_runtime.h"
#include "launcher/cpu_binding.h"
#include "launcher/device.h"
#include "launcher/launch.h"
#include "launcher/run_lock.h"
#include "models/model.h"
#include "train/evaluation.h"
#include "train/periodic.h"
#include "train/trainer.h"

namespace launcher {

// What start-up builds, phase by phase. Members are destroyed in reverse order: the Trainer
// before the communicators, model and data it refers to.
struct Startup {
  // A training run's lock on the places it writes (rank 0), held to the end: first, so that it is
  // released last, after the Trainer has finished its last write.
  std::unique_ptr<RunLock> outputs;
  // A training run (not --evaluate, --dry-run): it locks its outputs.
  bool writes_outputs = false;
  // --dry-run --plan-ranks: the model is planned from its shapes (built without storage), no
  // Trainer is built (launcher/dry_run_plan.h).
  bool plan_only = false;
  int rank = 0;
  std::unique_ptr<ddp::Communicator> bootstrap;  // phase 1's vote
  LaunchInfo launch;
  config::Config config;
  std::unique_ptr<ddp::Communicator>
      control;  // MPI, ddp.timeout_s: votes and the Trainer's control
  DeviceBinding binding;
  std::string backend;                     // the data plane's: "nccl" or "mpi"
  CpuBinding cpus;                         // the rank's cores (launcher/cpu_binding.h)
  int threads = 1;                         // at::set_num_threads
  std::unique_ptr<data::Dataset> dataset;  // null for --evaluate without data
  // --evaluate without data: why there is no validation ("data.path '...' does not exist").
  std::string no_data;
  std::shared_ptr<models::Model> model;
  // Rank 0, when resuming; its tensors are dropped once the Trainer has taken them.
  std::optional<checkpoint::Checkpoint> resume_from;
  // --evaluate: the weights are --generate's (launcher/resume.h, ResumeFor::kWeights).
  bool weights_only = false;
  train::EvalInputs eval_inputs;  // eval.tasks and bits per byte, handed to the Trainer
  std::unique_ptr<ddp::Communicator> data_comm;
  // ddp.shard_group: node: the control (MPI) and data-plane communicators over this node's ranks
  // and across nodes (train::HybridComms); empty otherwise.
  std::unique_ptr<ddp::Communicator> node_control, cross_control, node_data, cross_data;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  int64_t start_step = 0;  // optimizer steps done before this run (the checkpoint's)
  // What the loop runs between steps besides its own actions (rank 0's text samples).
  std::vector<train::PeriodicAction> actions;
  std::string device_flags;  // what train::apply_device_flags set, for the banner
};

int read_configuration(ddp::MpiRuntime& mpi, const std::string& config_path,
                       const std::vector<std::string>& overrides, Startup& s);
int prepare(ddp::MpiRuntime& mpi, Startup& s);
int build_trainer(Startup& s);

}  // namespace launcher
