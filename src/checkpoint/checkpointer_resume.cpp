// Checkpointer's resuming half: AdamW's moments from a checkpoint into the run's state, each rank
// reading only what it keeps where the checkpoint is sharded (docs/DESIGN.md, "Checkpoints",
// "Who reads"). The writing half is in checkpointer.cpp.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cstring>
#include <exception>

#include "checkpoint/checkpointer.h"
#include "checkpoint/sharded.h"
#include "core/error_text.h"
#include "ddp/gather.h"
#include "ddp/shard.h"

namespace checkpoint {
namespace {

// Sharded modes: this rank's block of every bucket of both moments, read from `reader` into
// `state`'s per-bucket moments (the elements it owns; zeros in the padding).
void read_moment_blocks(ShardedReader& reader, const RunState& state);

// `text` (rank 0's, of `length` bytes: every rank knows the length) on every rank. Collective.
std::string broadcast_text(ddp::Communicator& comm, const std::string& text, int64_t length,
                           const char* what) {
  at::Tensor bytes = at::zeros({length}, at::kByte);
  if (comm.rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  comm.broadcast(bytes, 0, what);
  return std::string(static_cast<const char*>(bytes.data_ptr()), length);
}

}  // namespace

int64_t Checkpointer::resume(const Checkpoint* ckpt, const RunState& state) {
  // Rank 0 chose the checkpoint (and applied its parameters to the model before the Trainer
  // broadcast them). The step, the length of the schedule's plan, and for an opened sharded
  // checkpoint the length of its path (-1: rank 0 holds whole tensors), go to every rank.
  const bool opened = ckpt != nullptr && ckpt->manifest.has_value();
  if (ckpt != nullptr) last_complete_ = ckpt->path;
  const int64_t schedule_length =
      ckpt != nullptr ? static_cast<int64_t>(ckpt->meta.schedule.size()) : 0;
  at::Tensor head =
      at::tensor({ckpt != nullptr ? ckpt->meta.step : int64_t{-1},
                  opened ? static_cast<int64_t>(ckpt->path.size()) : int64_t{-1}, schedule_length},
                 at::kLong);
  comms_.control.broadcast(head, 0, "resume step");
  const int64_t steps_done = head[0].item<int64_t>();
  const int64_t path_length = head[1].item<int64_t>();
  if (steps_done < 0) return 0;
  if (head[2].item<int64_t>() > 0) {
    const std::string plan = broadcast_text(comms_.control, ckpt ? ckpt->meta.schedule : "",
                                            head[2].item<int64_t>(), "resume schedule");
    if (state.resume_schedule) state.resume_schedule(steps_done, plan);
  }
  at::NoGradGuard no_grad;
  if (path_length >= 0) {
    const std::string path =
        broadcast_text(comms_.control, opened ? ckpt->path : "", path_length, "resume path");
    read_own_moments(path, opened ? &*ckpt->manifest : nullptr, state);
    return steps_done;
  }
  const auto named = state.model->named_parameters();
  if (state.reducer->sharded()) {  // rank 0 holds full moments; each rank takes its blocks
    std::vector<at::Tensor> m, v, p;
    for (size_t i = 0; ckpt != nullptr && i < named.size(); ++i) {
      const std::string& name = named[i].key();
      const bool muon = is_muon(state.muon, i);  // no second moment: zeros, unused
      m.push_back(ckpt->tensors.at(first_moment_key(name, muon)));
      v.push_back(muon ? at::zeros_like(m.back()) : ckpt->tensors.at(exp_avg_sq_key(name)));
      if (state.parameter_blocks) p.push_back(ckpt->tensors.at(param_key(name)));
    }
    state.reducer->shard_from(ckpt != nullptr ? &m : nullptr, state.exp_avgs);
    state.reducer->shard_from(ckpt != nullptr ? &v : nullptr, state.exp_avg_sqs);
    if (state.parameter_blocks) {
      state.reducer->shard_from(ckpt != nullptr ? &p : nullptr, state.reducer->parameter_shards());
    }
    return steps_done;
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].key();
    const bool muon = is_muon(state.muon, i);  // the same on every rank
    if (ckpt != nullptr) {
      state.exp_avgs[i].copy_(ckpt->tensors.at(first_moment_key(name, muon)));
      if (!muon) state.exp_avg_sqs[i].copy_(ckpt->tensors.at(exp_avg_sq_key(name)));
    }
    comms_.data.broadcast(state.exp_avgs[i], 0, "optimizer state of " + name);
    if (!muon) comms_.data.broadcast(state.exp_avg_sqs[i], 0, "optimizer state of " + name);
  }
  return steps_done;
}

void Checkpointer::read_own_moments(const std::string& step_dir, const io::ShardManifest* manifest,
                                    const RunState& state) {
  std::string failure;
  std::exception_ptr mine;
  resume_bytes_read_ = 0;
  try {
    io::ShardManifest read;
    if (manifest == nullptr) {  // rank 0 verified the files; the others read the layout only
      try {
        read = io::read_manifest(step_dir);
      } catch (const io::ShardManifestError& e) {
        throw CheckpointDamaged(e.what());
      }
    }
    ShardedReader reader(step_dir, manifest != nullptr ? *manifest : std::move(read));
    if (state.reducer->sharded()) {
      read_moment_blocks(reader, state);
    } else {
      // Unsharded, every rank keeps whole moments: each reads them itself, straight into its
      // optimizer state, rather than rank 0 reading and broadcasting them (no copy on rank 0).
      const auto named = state.model->named_parameters();
      for (size_t i = 0; i < named.size(); ++i) {
        const bool muon = is_muon(state.muon, i);
        reader.read_whole(first_moment_key(named[i].key(), muon), state.exp_avgs[i]);
        if (!muon) reader.read_whole(exp_avg_sq_key(named[i].key()), state.exp_avg_sqs[i]);
      }
    }
    resume_bytes_read_ = reader.bytes_read();
  } catch (const std::exception& e) {
    failure = core::first_line(e.what());
    mine = std::current_exception();
  }
  // Voted: a rank that cannot read its part must not leave the others waiting in a collective;
  // every rank fails, with the message naming the file.
  const auto failures = ddp::all_gather_strings(comms_.control, failure);
  if (mine) std::rethrow_exception(mine);
  for (int r = 0; r < comms_.control.size(); ++r) {
    if (!failures[r].empty()) {
      throw CheckpointError(
          fmt::format("rank {} could not read its part of {}: {}", r, step_dir, failures[r]));
    }
  }
}

namespace {

void read_moment_blocks(ShardedReader& reader, const RunState& state) {
  const auto named = state.model->named_parameters();
  const auto& layout = state.reducer->layout();
  const auto shards = state.reducer->shards();
  const std::vector<at::Tensor> masters =
      state.parameter_blocks ? state.reducer->parameter_shards() : std::vector<at::Tensor>{};
  const std::vector<at::Tensor>* moments[] = {&state.exp_avgs, &state.exp_avg_sqs, &masters};
  std::string (*const keys[])(const std::string&, bool) = {
      first_moment_key, second_moment_key,
      [](const std::string& name, bool) { return param_key(name); }};
  const size_t parts = state.parameter_blocks ? 3 : 2;  // the moments, and the masters
  for (size_t b = 0; b < layout.size(); ++b) {
    const ddp::BucketShard& shard = shards[b];
    for (size_t k = 0; k < parts; ++k) {
      const at::Tensor& block = (*moments[k])[b];
      // As Reducer::shard_from cuts it from whole tensors: zeros in the padding. A CPU block is
      // read in place; a device block through one host block at a time.
      const bool in_place = block.device().is_cpu() && block.is_contiguous();
      at::Tensor host =
          in_place ? block : at::empty({shard.size}, block.options().device(at::kCPU));
      host.zero_();
      for (size_t j = 0; j < layout[b].params.size(); ++j) {
        const at::Tensor& p = named[layout[b].params[j]].value();
        const int64_t offset = layout[b].offsets[j];
        const auto [first, last] = shard.owned(offset, p.numel());
        if (first >= last) continue;
        at::Tensor into = host.narrow(0, first - shard.begin, last - first);
        const std::string key =
            keys[k](named[layout[b].params[j]].key(), is_muon(state.muon, layout[b].params[j]));
        if (key.empty()) continue;  // Muon's unused second moment: zeros
        if (reader.order(key) == element_order_of(p)) {
          reader.read(key, first - offset, into);  // the file's order is the bucket's
          continue;
        }
        // The bucket holds this parameter by its strides (say channels-last), the checkpoint in
        // another order (say row-major): read it whole and lay it out as the Reducer's view does.
        at::Tensor laid = at::empty({p.numel()}, host.options());
        reader.read_whole(key, laid.as_strided(p.sizes(), p.strides()));
        into.copy_(laid.narrow(0, first - offset, last - first));
      }
      if (!in_place) block.copy_(host);
    }
  }
}

}  // namespace
}  // namespace checkpoint
