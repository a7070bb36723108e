#include "checkpoint/read.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>
#include <set>
#include <system_error>

#include "checkpoint/files.h"
#include "checkpoint/sharded.h"
#include "checkpoint/single_file.h"
#include "models/deferred_init.h"

namespace checkpoint {
namespace {

// Everything a checkpoint of `model` holds: its entries, then both moments of each parameter
// (with the parameter, whose shape and dtype they share).
std::vector<std::pair<std::string, at::Tensor>> expected_tensors(models::Model& model) {
  auto out = model_entries(model);
  const auto params = model.named_parameters();
  for (const auto& item : params) out.emplace_back(exp_avg_key(item.key()), item.value());
  for (const auto& item : params) out.emplace_back(exp_avg_sq_key(item.key()), item.value());
  return out;
}

// A tensor's shape and dtype, as a checkpoint holds it (a tensor, or an opened sharded
// checkpoint's logical tensor).
struct Held {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

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

}  // namespace

Checkpoint read_checkpoint(const std::string& path, ShardedRead sharded) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return sharded == ShardedRead::kOpen ? open_sharded_checkpoint(path)
                                         : read_sharded_checkpoint(path);
  }
  return read_single_file(path);
}

void check_compatible(const Checkpoint& ckpt, models::Model& model) {
  const auto expected = expected_tensors(model);
  const auto held = held_tensors(ckpt);
  for (const auto& [key, t] : expected) {
    const auto it = held.find(key);
    if (it == held.end()) {
      throw CheckpointError(fmt::format(
          "{}: the model has '{}' ({}), the checkpoint does not: it was written for another model "
          "(compare the model section of the config)",
          ckpt.path, key, describe(t)));
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
