#include "train/reference_logps.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "io/safetensors.h"
#include "train/eval_slice.h"
#include "train/precision.h"

namespace train {
namespace {

// The table of `split` (float64 [pairs, 2] on the model's device): this rank's slice computed,
// summed over ranks. Collective.
at::Tensor compute_table(Trainer& trainer, const data::Dataset& split, int64_t batch) {
  models::Model& model = trainer.model();
  const c10::Device device = model_device(model);
  const int64_t n = split.size();
  const EvalSlice slice = eval_slice(n, trainer.control().size(), trainer.control().rank());
  at::Tensor table = at::zeros({n, 2}, at::kDouble);
  const at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const auto units = trainer.units_in_step();  // ddp.shard: parameters, one unit at a time
  for (int64_t start = slice.begin; start < slice.end(); start += batch) {
    const int64_t rows = std::min(batch, slice.end() - start);
    data::Batch b =
        data::to_device(split.get(at::arange(start, start + rows, at::kLong)), 0, rows, device);
    const AutocastScope autocast(device, trainer.precision());
    table.narrow(0, start, rows).copy_(trainer.objective().pair_logps(b));
  }
  settle_units(model);
  if (units) units->finish();
  if (was_training) model.train();
  trainer.control().all_reduce(table, ddp::ReduceOp::kSum, "reference log-probabilities");
  return table.to(device);
}

// Rank 0's tables from `path` (training, validation), checked against the splits' sizes.
std::pair<at::Tensor, at::Tensor> read_tables(const std::string& path,
                                              const data::Dataset& dataset) {
  if (!std::filesystem::exists(path)) {
    throw std::invalid_argument(fmt::format(
        "train.objective: dpo resumes with the reference log-probabilities of its first start, "
        "kept beside its checkpoints: {} is not there",
        path));
  }
  const auto tensors = io::read_safetensors(path);
  const auto validation = dataset.validation();
  std::pair<at::Tensor, at::Tensor> out;
  for (const auto& [name, split, into] :
       {std::tuple{"train", &dataset, &out.first},
        std::tuple{"validation", validation.get(), &out.second}}) {
    if (split == nullptr) continue;
    const auto it = tensors.find(name);
    if (it == tensors.end() || it->second.dim() != 2 || it->second.size(0) != split->size() ||
        it->second.size(1) != 2) {
      throw std::invalid_argument(fmt::format(
          "{}: no '{}' table of {} pairs x 2: the reference log-probabilities of other data than "
          "data.path's (train.objective: dpo)",
          path, name, split->size()));
    }
    *into = it->second.to(at::kDouble).contiguous();
  }
  return out;
}

// The tables of a resumed run: rank 0 reads them (beside the checkpoint it resumes), every rank
// learns whether it could, and rank 0's are broadcast. Collective.
std::pair<at::Tensor, at::Tensor> resumed_tables(Trainer& trainer, const std::string& path) {
  ddp::Communicator& control = trainer.control();
  const data::Dataset& dataset = trainer.dataset();
  const auto validation = dataset.validation();
  std::pair<at::Tensor, at::Tensor> tables = {
      at::zeros({dataset.size(), 2}, at::kDouble),
      validation ? at::zeros({validation->size(), 2}, at::kDouble) : at::Tensor()};
  std::string failure;
  if (control.rank() == 0) {
    try {
      tables = read_tables(path, dataset);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  at::Tensor failed = at::tensor({failure.empty() ? 0.0 : 1.0}, at::kDouble);
  control.all_reduce(failed, ddp::ReduceOp::kSum, "reference: read");
  if (failed.item<double>() > 0) {
    throw std::invalid_argument(!failure.empty()
                                    ? failure
                                    : "train.objective: dpo: rank 0 could not read the reference "
                                      "log-probabilities (its message says why)");
  }
  control.broadcast(tables.first, 0, "reference: training table");
  if (tables.second.defined()) control.broadcast(tables.second, 0, "reference: validation table");
  return tables;
}

}  // namespace

void prepare_reference(Trainer& trainer, const std::string& dir, const std::string& resumed_from) {
  Objective& objective = trainer.objective();
  ddp::Communicator& control = trainer.control();
  const bool rank0 = control.rank() == 0;
  if (objective.reference() != ReferenceKind::kPrecomputed) {
    if (rank0 && objective.preference()) {
      spdlog::info("train.objective: {}: reference {}", objective.name(),
                   objective.reference_text());
    }
    return;
  }
  // Rank 0 alone chose the checkpoint: every rank learns whether there is one.
  at::Tensor resumes = at::tensor({resumed_from.empty() ? 0.0 : 1.0}, at::kDouble);
  control.all_reduce(resumes, ddp::ReduceOp::kSum, "reference: resuming");
  const std::string path = dir.empty() ? std::string() : dir + "/" + kReferenceFile;
  std::string source;
  std::pair<at::Tensor, at::Tensor> tables;
  if (resumes.item<double>() > 0) {
    if (rank0) {
      source = (std::filesystem::path(resumed_from).parent_path() / kReferenceFile).string();
    }
    tables = resumed_tables(trainer, source);
  } else {
    const int64_t batch = std::max<int64_t>(1, trainer.plan().micro_batch);
    const auto validation = trainer.dataset().validation();
    tables = {compute_table(trainer, trainer.dataset(), batch),
              validation ? compute_table(trainer, *validation, batch) : at::Tensor()};
  }
  // Kept in this run's directory, for its own resumes.
  if (rank0 && !path.empty() &&
      !(std::filesystem::exists(source) && std::filesystem::exists(path) &&
        std::filesystem::equivalent(source, path))) {
    std::filesystem::create_directories(dir);
    std::map<std::string, at::Tensor> tensors = {{"train", tables.first}};
    if (tables.second.defined()) tensors.emplace("validation", tables.second);
    io::write_safetensors(path, tensors, {{"objective", "dpo"}});
  }
  if (rank0) {
    spdlog::info(
        "train.objective: dpo: reference {} ({} pairs{}){}", objective.reference_text(),
        tables.first.size(0),
        tables.second.defined() ? fmt::format(", {} validation", tables.second.size(0)) : "",
        source.empty() ? (path.empty() ? "" : ", kept in " + path) : ", read from " + source);
  }
  const c10::Device device = trainer.device();
  objective.set_reference(tables.first.to(device),
                          tables.second.defined() ? tables.second.to(device) : at::Tensor());
}

}  // namespace train
