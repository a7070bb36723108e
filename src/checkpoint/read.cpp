#include "checkpoint/read.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>

#include "checkpoint/files.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "io/safetensors.h"
#include "io/shard_manifest.h"
#include "models/capabilities.h"
#include "models/deferred_init.h"

namespace checkpoint {
namespace {

// A tensor's shape and dtype, as a checkpoint holds it (a tensor, or an opened sharded
// checkpoint's logical tensor).
struct Held {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

// Everything a checkpoint of `model` holds: its entries, then the moments of each parameter
// (with the parameter, whose shape and dtype they share): AdamW's two, or the momentum of a
// matrix in `muon`. With `any_optimizer`, each parameter's as the checkpoint `held` has them.
std::vector<std::pair<std::string, at::Tensor>> expected_tensors(
    models::Model& model, const std::set<std::string>& muon, bool any_optimizer,
    const std::map<std::string, Held>& held) {
  auto out = model_entries(model);
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const bool is_muon =
        any_optimizer ? held.count(muon_momentum_key(name)) > 0 : muon.count(name) > 0;
    out.emplace_back(first_moment_key(name, is_muon), item.value());
    if (!is_muon) out.emplace_back(second_moment_key(name, is_muon), item.value());
  }
  return out;
}

std::string describe(at::IntArrayRef sizes, at::ScalarType dtype) {
  return fmt::format("{} {}", sizes, c10::toString(dtype));
}
std::string describe(const at::Tensor& t) { return describe(t.sizes(), t.scalar_type()); }

std::map<std::string, Held> held_tensors(const Checkpoint& ckpt) {
  std::map<std::string, Held> out;
  for (const auto& [key, t] : ckpt.tensors) out[key] = {t.sizes().vec(), t.scalar_type()};
  if (!ckpt.manifest) return out;
  for (const auto& [key, logical] : ckpt.manifest->tensors) {
    const auto dtype = io::dtype_from_name(logical.dtype);
    if (!dtype) {
      throw CheckpointDamaged(fmt::format("{}/{}: '{}' has the unknown dtype '{}'", ckpt.path,
                                          io::kShardManifestName, key, logical.dtype));
    }
    out[key] = {logical.shape, *dtype};
  }
  return out;
}

// A LoRA checkpoint holds the adapters of one frozen base (models::FrozenBase), which it does not
// hold: the model's base must be the one it records (CheckpointMeta::base_hash), and a model
// without adapters cannot take it.
void check_base(const Checkpoint& ckpt, models::Model& model) {
  const auto* frozen = models::as<models::FrozenBase>(model);
  const std::string hash = frozen != nullptr ? frozen->base_hash() : "";
  const std::string& held = ckpt.meta.base_hash;
  if (hash == held) return;
  const std::string path = frozen != nullptr ? frozen->base_path() : "";
  auto name = [](const std::string& base, const std::string& h) {
    return fmt::format("'{}' ({})", base.empty() ? "the config's model" : base, h);
  };
  if (held.empty()) {
    throw CheckpointError(fmt::format(
        "{}: the checkpoint holds a whole model, not LoRA adapters, and this config trains "
        "adapters (model.lora_rank) over the base {}; resume it without model.lora_rank, or "
        "start the LoRA run from model.init_from",
        ckpt.path, name(path, hash)));
  }
  if (hash.empty()) {
    throw CheckpointError(fmt::format(
        "{}: the checkpoint holds LoRA adapters of the base {} and not the base itself; set "
        "model.lora_rank and model.init_from as the run that wrote it did",
        ckpt.path, name(ckpt.meta.base, held)));
  }
  throw CheckpointError(fmt::format(
      "{}: the checkpoint holds LoRA adapters of the base {}, and model.init_from is the "
      "base {}: another base (its config or tensors differ); set model.init_from to the base "
      "the checkpoint was trained on",
      ckpt.path, name(ckpt.meta.base, held), name(path, hash)));
}

}  // namespace

Checkpoint read_checkpoint(const std::string& path, ShardedRead sharded) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return sharded == ShardedRead::kOpen ? open_sharded_checkpoint(path)
                                         : read_sharded_checkpoint(path);
  }
  return read_single_file(path);
}

Checkpoint read_checkpoint_header(const std::string& path) {
  Checkpoint ckpt;
  ckpt.path = path;
  std::error_code ec;
  try {
    if (std::filesystem::is_directory(path, ec)) {
      io::ShardManifest m = io::read_manifest(path);
      ckpt.meta = {m.step, m.global_batch_size, m.seed, m.world_size, {}, {}, m.base, m.base_hash};
      ckpt.manifest = std::move(m);
      return ckpt;
    }
    const io::SafetensorsRangeReader header(path);
    const auto meta = io::read_safetensors_metadata(path);
    io::ShardManifest m;
    for (const auto& [key, info] : header.tensors()) {
      m.tensors[key] = {io::dtype_name(info.dtype).value_or("?"), info.shape};
    }
    const auto text = [&meta](const char* key) {
      const auto it = meta.find(key);
      return it == meta.end() ? std::string() : it->second;
    };
    ckpt.meta.base = text("base");
    ckpt.meta.base_hash = text("base_hash");
    ckpt.manifest = std::move(m);
  } catch (const io::SafetensorsError& e) {
    throw CheckpointDamaged(e.what());
  } catch (const io::ShardManifestError& e) {
    throw CheckpointDamaged(e.what());
  }
  return ckpt;
}

void check_compatible(const Checkpoint& ckpt, models::Model& model,
                      const std::optional<std::vector<std::string>>& muon) {
  check_base(ckpt, model);
  const auto held = held_tensors(ckpt);
  const std::set<std::string> matrices =
      muon ? std::set<std::string>(muon->begin(), muon->end()) : std::set<std::string>();
  const auto expected = expected_tensors(model, matrices, !muon.has_value(), held);
  for (const auto& [key, t] : expected) {
    const auto it = held.find(key);
    if (it == held.end()) {
      const bool moment = !key.starts_with("param.") && !key.starts_with("buffer.");
      throw CheckpointError(fmt::format(
          "{}: the model has '{}' ({}), the checkpoint does not: it was written for another {} "
          "(compare the {} section of the config)",
          ckpt.path, key, describe(t), moment ? "optimizer" : "model",
          moment ? "train.optimizer key of the train" : "model"));
    }
    if (t.sizes() != at::IntArrayRef(it->second.sizes) || it->second.dtype != t.scalar_type()) {
      throw CheckpointError(fmt::format(
          "{}: '{}' is {} in the checkpoint but {} in the model (compare the model section of "
          "the config)",
          ckpt.path, key, describe(it->second.sizes, it->second.dtype), describe(t)));
    }
  }
  std::set<std::string> keys;
  for (const auto& [key, t] : expected) keys.insert(key);
  for (const auto& [key, h] : held) {
    if (!keys.count(key)) {
      throw CheckpointError(fmt::format(
          "{}: the checkpoint has '{}' ({}), the model does not: it was written for another "
          "model (compare the model section of the config)",
          ckpt.path, key, describe(h.sizes, h.dtype)));
    }
  }
}

void apply_model_state(const Checkpoint& ckpt, models::Model& model) {
  at::NoGradGuard no_grad;
  // A model built without storage (models/deferred_init.h) takes its buffers here; each rank
  // reads its blocks of the parameters on resume (RunState::parameter_blocks).
  const auto entries = model_entries(model);
  if (!ckpt.manifest) {
    for (const auto& [key, t] : entries) {
      if (!models::holds_no_storage(t)) t.copy_(ckpt.tensors.at(key));
    }
    return;
  }
  // Straight from the files into the model's tensors: no copy of the model besides the model.
  ShardedReader reader(ckpt.path, *ckpt.manifest);
  for (const auto& [key, t] : entries) {
    if (!models::holds_no_storage(t)) reader.read_whole(key, t);
  }
}

models::ParameterReader parameter_reader(const Checkpoint& ckpt) {
  if (!ckpt.manifest) {
    const std::map<std::string, at::Tensor> tensors = ckpt.tensors;  // handles, not copies
    return [tensors](const std::string& name, int64_t first, const at::Tensor& out) {
      out.copy_(tensors.at(param_key(name)).reshape({-1}).narrow(0, first, out.numel()));
    };
  }
  auto reader = std::make_shared<ShardedReader>(ckpt.path, *ckpt.manifest);
  return [reader](const std::string& name, int64_t first, const at::Tensor& out) {
    const std::string key = param_key(name);
    if (reader->order(key).empty()) return reader->read(key, first, out);
    // Not row-major in the files (a channels-last weight): whole, then the range.
    const auto& shape = reader->manifest().tensors.at(key).shape;
    at::Tensor whole = at::empty(shape, out.options());
    reader->read_whole(key, whole);
    out.copy_(whole.reshape({-1}).narrow(0, first, out.numel()));
  };
}

std::string newest_good_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                   Checkpoint* out, ShardedRead sharded) {
  for (const auto& path : checkpoints_newest_first(dir)) {
    try {
      *out = read_checkpoint(path, sharded);
      return path;
    } catch (const CheckpointDamaged& e) {
      skipped->push_back(e.what());
    } catch (const CheckpointError& e) {
      // A header that does not parse at all also means a damaged file here: it was listed as a
      // checkpoint candidate by name.
      skipped->push_back(e.what());
    }
  }
  return "";
}

}  // namespace checkpoint
