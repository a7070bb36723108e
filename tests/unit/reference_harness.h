// The PyTorch reference check (docs/DESIGN.md, "Tests and benchmarks"): a model's loss and every
// gradient against the same model written independently in PyTorch (tests/reference/<script>), on
// the same weights and batch.
//
// run_reference writes `tensors` and `meta` to IN.safetensors, runs
//   TRAINER_PYTHON tests/reference/<script> IN.safetensors OUT.safetensors
// and returns OUT's tensors. Scripts read the model's parameters by the trainer's names plus
// "inputs" and "targets", build the model from the metadata, and write "loss" (0-dim) and
// "grad.<name>" for every parameter. A script that fails fails the test with its output.
//
// expect_matches_reference runs the model's loss and backward here, the script there, and checks
// the loss and each gradient to a relative error (|a - b| / max(|b|, tiny), over the whole
// tensor as a norm) below `tolerance`; a gradient that is zero in the reference (to 1e-6 of the
// largest) must be as small here. `frozen` tensors (a model's buffers that the reference
// needs: frozen weights, integer tables) travel as "frozen.<name>" and get no gradient.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "common/python_runner.h"
#include "common/temp_dir.h"
#include "io/safetensors.h"
#include "models/capabilities.h"
#include "models/model.h"

namespace test {

inline std::map<std::string, at::Tensor> run_reference(
    const std::string& script, const std::map<std::string, at::Tensor>& tensors,
    const std::map<std::string, std::string>& meta) {
  TempDir dir;
  const std::string in = dir.path() + "/in.safetensors", out = dir.path() + "/out.safetensors",
                    log = dir.path() + "/log.txt";
  io::write_safetensors(in, tensors, meta);
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/tests/reference/" + script;
  const std::string cmd = path + " " + in + " " + out;
  const int rc = run_python(path, in + " " + out, log);
  if (rc != 0) {
    std::string text;
    if (FILE* f = std::fopen(log.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      std::fclose(f);
    }
    ADD_FAILURE() << "reference script failed (" << rc << "): " << cmd << "\n" << text;
    return {};
  }
  return io::read_safetensors(out);
}

inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  const double ref = b.to(at::kDouble).norm().item<double>();
  return diff / std::max(ref, 1e-30);
}

// Runs loss + backward of `model` on (inputs, targets) here and in the reference script; expects
// the loss and every parameter's gradient within `tolerance` (relative). `meta` describes the
// model to the script (dimensions, options).
// `positions` (packed documents, models::PackedDocuments): travels as "positions", and the loss
// here is models::loss_of's.
inline void expect_matches_reference(models::Model& model, const at::Tensor& inputs,
                                     const at::Tensor& targets, const std::string& script,
                                     const std::map<std::string, std::string>& meta,
                                     double tolerance = 1e-4,
                                     const std::map<std::string, at::Tensor>& frozen = {},
                                     const at::Tensor& positions = {}) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model.named_parameters()) tensors[item.key()] = item.value().detach();
  for (const auto& [name, t] : frozen) tensors["frozen." + name] = t.detach();
  tensors["inputs"] = inputs;
  tensors["targets"] = targets;
  if (positions.defined()) tensors["positions"] = positions;
  model.zero_grad();
  const at::Tensor loss = models::loss_of(model, inputs, targets, positions);
  loss.backward();
  const auto ref = run_reference(script, tensors, meta);
  if (ref.empty()) return;
  ASSERT_TRUE(ref.count("loss")) << script << " wrote no 'loss'";
  const double loss_error = relative_error(loss.detach(), ref.at("loss"));
  double worst = 0;
  std::string worst_name;
  EXPECT_LT(loss_error, tolerance)
      << "loss " << loss.item<double>() << " vs reference " << ref.at("loss").item<double>();
  // A gradient that is zero by the model's algebra (say a bias that shifts both scores a loss
  // compares) is rounding noise on both sides, whose relative difference means nothing: one whose
  // reference norm is below 1e-6 of the largest must be as small here, to 1e-5 of the largest.
  double largest = 0;
  for (const auto& [key, t] : ref) {
    if (key.rfind("grad.", 0) == 0)
      largest = std::max(largest, t.to(at::kDouble).norm().item<double>());
  }
  for (const auto& item : model.named_parameters()) {
    const std::string key = "grad." + item.key();
    ASSERT_TRUE(ref.count(key)) << script << " wrote no '" << key << "'";
    ASSERT_TRUE(item.value().grad().defined()) << item.key() << " got no gradient here";
    if (ref.at(key).to(at::kDouble).norm().item<double>() < 1e-6 * largest) {
      EXPECT_LT(item.value().grad().to(at::kDouble).norm().item<double>(), 1e-5 * largest)
          << "gradient of " << item.key() << " (zero in the reference)";
      continue;
    }
    const double error = relative_error(item.value().grad(), ref.at(key));
    if (error >= worst) worst = error, worst_name = item.key();
    EXPECT_LT(error, tolerance) << "gradient of " << item.key();
  }
  std::printf("%s: loss relative error %.1e, worst gradient %.1e (%s)\n", script.c_str(),
              loss_error, worst, worst_name.c_str());
}

}  // namespace test
