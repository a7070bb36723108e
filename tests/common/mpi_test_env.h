// Access to the process's MpiRuntime from MPI tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/mpi_runtime.h"
#include "train/trainer.h"

namespace trainer_test {

void set_runtime(ddp::MpiRuntime* runtime);
ddp::MpiRuntime& runtime();

// ||a - b|| / ||b|| over all tensors together, in double precision.
double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

// A copy of the model's parameters.
std::vector<at::Tensor> snapshot(models::Model& m);
// Expects every rank of `comm` to hold exactly the same tensors. Collective.
void expect_same_on_every_rank(ddp::Communicator& comm, const std::vector<at::Tensor>& params);

// The first W - 1 ranks of the world as a communicator of their own (a smaller job beside the
// world); null on the last rank. Collective over MPI_COMM_WORLD.
std::unique_ptr<ddp::Communicator> all_but_last_rank(const ddp::Communicator& world);

// A Trainer on CPU from a YAML configuration (its data set and model seeded by train.seed),
// and what it borrows.
struct CpuRun {
  std::unique_ptr<data::Dataset> dataset;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<train::Trainer> trainer;
};
// `hybrid`: ddp.shard_group: node's communicators (train::HybridComms). `deferred`: the model is
// built without storage (models/deferred_init.h), as the launcher builds a language model under
// ddp.shard: parameters.
CpuRun make_cpu_run(ddp::Communicator& comm, const std::string& yaml, const std::string& name,
                    train::HybridComms hybrid = {}, bool deferred = false);

// A directory, kept for the whole process, holding one token shard (train_000.bin: 6000 uint16
// tokens below 97) for gpt and llama on `data: {dataset: tokens}`.
const std::string& token_shard_dir();

// Trains steps [the checkpoint's step, until) of a CPU run of `yaml` whose model is first seeded
// with `model_seed` (overwritten by `resume_from` when set: rank 0 reads it, as main does); then
// rank 0 writes `save_to` when set, and every rank waits for it. Returns this rank's parameters.
// Collective.
std::vector<at::Tensor> train_until(ddp::Communicator& comm, const std::string& yaml, int64_t until,
                                    uint64_t model_seed, const std::string& resume_from,
                                    const std::string& save_to, train::HybridComms hybrid = {});

}  // namespace trainer_test
