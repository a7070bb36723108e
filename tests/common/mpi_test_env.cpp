#include "common/mpi_test_env.h"
#include "common/trainer_seam.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/checkpointer.h"
#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "data/registry.h"
#include "ddp/mpi_communicator.h"
#include "models/capabilities.h"
#include "models/deferred_init.h"
#include "models/registry.h"
#include "train/loop.h"

#include <mpi.h>

#include <optional>

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace trainer_test {
namespace {
ddp::MpiRuntime* g_runtime = nullptr;
}

void set_runtime(ddp::MpiRuntime* runtime) { g_runtime = runtime; }

ddp::MpiRuntime& runtime() {
  if (g_runtime == nullptr) throw std::logic_error("MPI tests need mpi_test_main.cpp");
  return *g_runtime;
}

double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0;
  double norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i].to(at::kDouble) - b[i].to(at::kDouble)).pow(2).sum().item<double>();
    norm += b[i].to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

std::vector<at::Tensor> snapshot(models::Model& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_same_on_every_rank(ddp::Communicator& comm, const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    at::Tensor max = p.clone(), min = p.clone();
    comm.all_reduce(max, ddp::ReduceOp::kMax);
    comm.all_reduce(min, ddp::ReduceOp::kMin);
    EXPECT_TRUE(at::equal(max, min)) << "the ranks hold different values";
  }
}

std::unique_ptr<ddp::Communicator> all_but_last_rank(const ddp::Communicator& world) {
  const int rank = world.rank();
  MPI_Comm split = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world.size() - 1 ? 0 : MPI_UNDEFINED, rank, &split);
  if (split == MPI_COMM_NULL) return nullptr;
  auto out = std::make_unique<ddp::MpiCommunicator>(split, std::chrono::seconds(60));
  MPI_Comm_free(&split);
  return out;
}

CpuRun make_cpu_run(ddp::Communicator& comm, const std::string& yaml, const std::string& name,
                    train::HybridComms hybrid, bool deferred) {
  const auto config = config::parse_config(yaml, name);
  CpuRun r;
  r.dataset = data::make_dataset(config.data);
  at::manual_seed(config.train.seed);
  std::optional<models::DeferredInit> scope;
  if (deferred) scope.emplace(c10::Device(c10::kCPU));
  r.model = models::create_model(config.model, r.dataset->shape());
  if (scope) r.model->set_deferred_init(scope->finish(*r.model));
  r.trainer = std::make_unique<train::Trainer>(config.trainer_options(), comm, comm, r.model,
                                               *r.dataset, c10::Device(c10::kCPU), hybrid);
  return r;
}

const std::string& token_shard_dir() {
  static const test::TempDir dir;
  static const bool written = [] {
    const at::Tensor tokens = (at::arange(6000, at::kLong) * 7919 % 97).to(at::kShort);
    FILE* f = std::fopen((dir.path() + "/train_000.bin").c_str(), "wb");
    std::fwrite(tokens.data_ptr(), 2, 6000, f);
    std::fclose(f);
    return true;
  }();
  (void)written;
  return dir.path();
}

std::vector<at::Tensor> train_until(ddp::Communicator& comm, const std::string& yaml, int64_t until,
                                    uint64_t model_seed, const std::string& resume_from,
                                    const std::string& save_to, train::HybridComms hybrid) {
  const auto config = config::parse_config(yaml, "train_until.yaml");
  const auto dataset = data::make_dataset(config.data);
  at::manual_seed(model_seed);
  auto model = models::create_model(config.model, dataset->shape());
  std::optional<checkpoint::Checkpoint> ckpt;
  if (!resume_from.empty() && comm.rank() == 0) {
    ckpt = checkpoint::read_checkpoint(resume_from,
                                       checkpoint::ShardedRead::kOpen);  // as the launcher
    std::vector<std::string> muon;  // train.optimizer: muon: its matrices hold its momentum
    if (config.train.optimizer == train::OptimizerKind::kMuon) {
      muon = models::hidden_parameters(*models::as<models::HiddenMatrices>(*model));
    }
    checkpoint::check_compatible(*ckpt, *model, muon);
    checkpoint::apply_model_state(*ckpt, *model);
  }
  train::Trainer trainer(config.trainer_options(), comm, comm, model, *dataset,
                         c10::Device(c10::kCPU), hybrid);
  const auto checkpointer = train::make_checkpointer(trainer, "");
  const int64_t start = train::resume(*checkpointer, trainer, ckpt ? &*ckpt : nullptr);
  for (int64_t s = start + 1; s <= until; ++s) trainer.step(s);
  if (!save_to.empty()) {
    checkpointer->save(save_to, until, trainer.run_state());
    checkpointer->finish();  // checkpoint.async: the write, the vote, rank 0's commit
    comm.barrier("checkpoint written");
  }
  const auto pinned =
      trainer_test::pin_parameters(trainer);  // ddp.shard: parameters: the whole model
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

}  // namespace trainer_test
