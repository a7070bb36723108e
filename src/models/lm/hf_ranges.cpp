#include "models/lm/hf_ranges.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "models/lm/causal_lm.h"
#include "models/lm/lora.h"

namespace models {
namespace {

// Elements per row of a parameter: the product of its dimensions after the first.
int64_t row_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

// What hf_range_reader's closure keeps: the files open for ranged reads.
struct RangeFiles {
  std::map<std::string, HfHeader> headers;
  std::map<std::string, std::unique_ptr<io::SafetensorsRangeReader>> open;  // by file
  std::map<std::string, std::vector<HfTensor>> by_param;  // loading entries first, checks last
  ParameterShapes shapes;

  io::SafetensorsRangeReader& reader(const std::string& file) {
    auto& r = open[file];
    if (!r) r = std::make_unique<io::SafetensorsRangeReader>(file);
    return *r;
  }

  // Elements [a, b) of `t.param` (flat) from the file tensor `t` into `out` (float32, b - a).
  void read_rows(const HfTensor& t, int64_t a, int64_t b, const at::Tensor& out) {
    const HfHeader& h = headers.at(t.name);
    io::SafetensorsRangeReader& r = reader(h.file);
    const int64_t c = row_size(shapes.at(t.param));
    const auto in_file = at::TensorOptions().dtype(h.dtype);
    if (!t.transposed) {
      const at::Tensor raw = at::empty({b - a}, in_file);
      r.read(t.name, a - t.row_begin * c, b - a, raw);
      out.copy_(raw);
      return;
    }
    // The file holds [c, rows]: the parameter's rows r0 .. r1 are a column range of each of its
    // c rows, one read each.
    const int64_t r0 = a / c, r1 = (b - 1) / c + 1;
    const at::Tensor raw = at::empty({c, r1 - r0}, in_file);
    for (int64_t col = 0; col < c; ++col) {
      r.read(t.name, col * t.rows + (r0 - t.row_begin), r1 - r0, raw[col]);
    }
    out.copy_(raw.t().reshape({-1}).narrow(0, a - r0 * c, b - a));
  }

  void read(const std::string& param, int64_t first, const at::Tensor& out) {
    at::NoGradGuard no_grad;
    out.zero_();  // rows no file tensor gives: the padded vocabulary
    const auto it = by_param.find(param);
    if (it == by_param.end()) throw init_error(fmt::format("no tensor for the model's {}", param));
    const int64_t c = row_size(shapes.at(param)), end = first + out.numel();
    for (const HfTensor& t : it->second) {
      const int64_t a = std::max(first, t.row_begin * c);
      const int64_t b = std::min(end, (t.row_begin + t.rows) * c);
      if (a >= b) continue;
      const at::Tensor into = out.narrow(0, a - first, b - a);
      if (!t.check_only) {
        read_rows(t, a, b, into);
        continue;
      }
      const at::Tensor copy = at::empty({b - a}, at::kFloat);
      read_rows(t, a, b, copy);
      if (!at::equal(copy, into)) {
        throw init_error(fmt::format("{}: {} differs from the model's {}, which it is tied to",
                                     headers.at(t.name).file, t.name, param));
      }
    }
  }
};

}  // namespace

ParameterShapes parameter_shapes(torch::nn::Module& model) {
  ParameterShapes shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  return shapes;
}

std::map<std::string, HfHeader> read_hf_headers(const HfFiles& files) {
  std::map<std::string, HfHeader> out;
  for (const std::string& file : files.files) {
    try {
      const io::SafetensorsRangeReader reader(file);
      for (const auto& [name, info] : reader.tensors()) {
        if (!out.emplace(name, HfHeader{file, info.dtype, info.shape}).second) {
          throw init_error(fmt::format("{}: '{}' is also in {}", file, name, out.at(name).file));
        }
      }
    } catch (const io::SafetensorsError& e) {
      throw init_error(e.what());
    }
  }
  return out;
}

void check_hf_map(const HfMap& map, const std::map<std::string, HfHeader>& headers,
                  const ParameterShapes& shapes,
                  const std::function<bool(const std::string&)>& ignored, const std::string& where,
                  const std::string& config) {
  std::set<std::string> named;
  for (const HfTensor& t : map) {
    named.insert(t.name);
    const std::vector<int64_t> want = t.file_shape(shapes.at(t.param));
    const auto it = headers.find(t.name);
    if (it == headers.end()) {
      if (t.check_only) continue;
      throw init_error(fmt::format("{}: no tensor '{}' for the model's {} {} ({})", where, t.name,
                                   t.param, shapes.at(t.param), config));
    }
    if (it->second.shape != want) {
      throw init_error(fmt::format("{}: {} has shape {} but the model ({}) needs {}{}", where,
                                   t.name, it->second.shape, config, want,
                                   t.transposed ? " (Conv1D layout)" : ""));
    }
    if (!at::isFloatingType(it->second.dtype)) {
      throw init_error(fmt::format("{}: tensor '{}' has dtype {}; a floating dtype is needed",
                                   where, t.name, c10::toString(it->second.dtype)));
    }
  }
  std::vector<std::string> extra;
  for (const auto& [name, h] : headers) {
    if (!named.count(name) && !(ignored && ignored(name))) extra.push_back(name);
  }
  if (!extra.empty()) {
    throw init_error(fmt::format("{}: tensors the model ({}) does not have: {}", where, config,
                                 fmt::join(extra, ", ")));
  }
}

ParameterReader hf_range_reader(const HfFiles& files, HfMap map, ParameterShapes shapes) {
  auto state = std::make_shared<RangeFiles>();
  state->headers = read_hf_headers(files);
  state->shapes = std::move(shapes);
  std::stable_sort(map.begin(), map.end(), [](const HfTensor& a, const HfTensor& b) {
    return !a.check_only && b.check_only;
  });
  for (HfTensor& t : map) {
    if (t.check_only && !state->headers.count(t.name)) continue;
    state->by_param[t.param].push_back(std::move(t));
  }
  return [state](const std::string& name, int64_t first, const at::Tensor& out) {
    try {
      state->read(name, first, out);
    } catch (const io::SafetensorsError& e) {
      throw init_error(e.what());
    }
  };
}

ParameterReader model_reader(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model.named_parameters()) params[item.key()] = item.value();
  return [params](const std::string& name, int64_t first, const at::Tensor& out) {
    at::NoGradGuard no_grad;
    const at::Tensor flat = params.at(name).detach().reshape({-1});
    out.copy_(flat.narrow(0, first, out.numel()));
  };
}

namespace {

// The model's adapted layers; null without LoRA.
const CausalLm* lora_model(torch::nn::Module& model) {
  const auto* lm = dynamic_cast<const CausalLm*>(&model);
  return lm != nullptr && lm->has_adapters() ? lm : nullptr;
}

// The frozen base's weights by name (lora_model's buffers that were parameters).
std::map<std::string, at::Tensor> frozen_weights(torch::nn::Module& model, const CausalLm& lm) {
  const auto names = lm.frozen_buffer_names();
  const std::set<std::string> frozen(names.begin(), names.end());
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_buffers()) {
    if (frozen.count(item.key()) > 0) out[item.key()] = item.value();
  }
  return out;
}

}  // namespace

ParameterShapes export_shapes(torch::nn::Module& model) {
  const CausalLm* lm = lora_model(model);
  if (lm == nullptr) return parameter_shapes(model);
  ParameterShapes shapes;
  for (const auto& [name, w] : frozen_weights(model, *lm)) shapes[name] = w.sizes().vec();
  return shapes;
}

ParameterReader export_reader(torch::nn::Module& model) {
  const CausalLm* lm = lora_model(model);
  if (lm == nullptr) return model_reader(model);
  // Each read merges its whole weight (a fused qkv_proj is read three times, once per q, k, v):
  // one weight's float32 copy at a time, never the merged model.
  return [weights = frozen_weights(model, *lm), sites = lm->lora_sites()](
             const std::string& name, int64_t first, const at::Tensor& out) {
    at::NoGradGuard no_grad;
    const at::Tensor merged = merged_weight(weights.at(name), name, sites);
    out.copy_(merged.reshape({-1}).narrow(0, first, out.numel()));
  };
}

std::string hf_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw std::invalid_argument(fmt::format("no export dtype {}", c10::toString(dtype)));
  }
}

std::vector<std::string> write_hf_streaming(const std::string& dir, const std::string& config_json,
                                            const HfMap& map, const ParameterShapes& shapes,
                                            const ParameterReader& read, int64_t max_shard_bytes,
                                            at::ScalarType dtype) {
  nlohmann::json config = nlohmann::json::parse(config_json);
  config["dtype"] = config["torch_dtype"] = hf_dtype_name(dtype);
  std::vector<io::TensorEntry> entries;
  std::map<std::string, const HfTensor*> by_name;
  for (const HfTensor& t : map) {
    if (t.check_only) continue;
    entries.push_back({t.name, dtype, t.file_shape(shapes.at(t.param))});
    by_name[t.name] = &t;
  }
  // One file tensor at a time: its rows of the parameter, read, and laid out as the file has them.
  const auto produce = [&](const io::TensorEntry& e) {
    const HfTensor& t = *by_name.at(e.name);
    const std::vector<int64_t>& shape = shapes.at(t.param);
    const int64_t c = row_size(shape);
    at::Tensor rows = at::empty({t.rows * c}, at::kFloat);
    read(t.param, t.row_begin * c, rows);
    std::vector<int64_t> rows_shape = shape;
    rows_shape[0] = t.rows;
    at::Tensor out = rows.view(rows_shape);
    return (t.transposed ? out.t() : out).to(dtype).contiguous();
  };
  return write_hf_dir(dir, config.dump(2) + "\n", entries, produce, max_shard_bytes);
}

}  // namespace models
