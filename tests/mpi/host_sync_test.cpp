// No host synchronisation in the step (Note [No host synchronisation in the step], trainer.cpp):
// a step that logs nothing reads nothing from the device, and reading lazily changes nothing.
//
// Two counters watch each step: the Trainer's own count of its device-to-host reads, and a
// RecordFunction observer on this thread that counts every scalar read through the dispatcher
// (`.item()` ends in aten::_local_scalar_dense), so a stray read anywhere in the step, in the
// Trainer or below it, is caught too. On CPU a read costs nothing; on a GPU each one would stall
// the host until the device drains.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <string_view>

#include "common/mpi_test_env.h"
#include "common/trainer_seam.h"
#include "config/config.h"
#include "models/registry.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

std::atomic<int64_t> g_scalar_reads{0};
thread_local int t_inside_fused_adamw = 0;

bool is_fused_adamw(const at::RecordFunction& fn) {
  return std::string_view(fn.name()) == "aten::_fused_adamw_";
}

// Counts aten::_local_scalar_dense on the calling thread while it lives. Reads inside ATen's
// fused AdamW kernel are left out: its CPU implementation reads each parameter's step counter
// with item() (a host tensor there); its CUDA kernel reads the counter on the device.
class ScalarReadObserver {
 public:
  ScalarReadObserver()
      : handle_(at::addThreadLocalCallback(
            at::RecordFunctionCallback(
                [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                  if (is_fused_adamw(fn)) ++t_inside_fused_adamw;
                  if (std::string_view(fn.name()) == "aten::_local_scalar_dense" &&
                      t_inside_fused_adamw == 0) {
                    ++g_scalar_reads;
                  }
                  return nullptr;
                },
                [](const at::RecordFunction& fn, at::ObserverContext*) {
                  if (is_fused_adamw(fn)) --t_inside_fused_adamw;
                })
                .scopes({at::RecordScope::FUNCTION}))) {}
  ~ScalarReadObserver() { at::removeCallback(handle_); }
  ScalarReadObserver(const ScalarReadObserver&) = delete;
  ScalarReadObserver& operator=(const ScalarReadObserver&) = delete;

 private:
  at::CallbackHandle handle_;
};

using Trained = trainer_test::CpuRun;

// `muon`: gpt with train.optimizer: muon (its hidden matrices orthogonalised, on the device).
Trained make(ddp::Communicator& comm, const std::string& precision, const std::string& extra,
             const std::string& shard, bool muon = false) {
  const std::string model =
      muon ? "model: {name: gpt, preset: tiny, num_layers: 2, d_model: 32, heads: 4}\n"
             "data: {dataset: tokens, path: " +
                 trainer_test::token_shard_dir() + ", context: 16, vocab_size: 100}\n"
           : "model: {name: mlp, hidden_dim: 32, depth: 2}\n"
             "data: {num_samples: 1000, input_dim: 8, num_classes: 4, teacher_hidden: 8, seed: "
             "7}\n";
  return trainer_test::make_cpu_run(
      comm,
      model +
          "train: {device: cpu, global_batch_size: 13, micro_batch_size: 3, steps: 12, lr: 0.01,\n"
          "        warmup_steps: 1, seed: 11, grad_clip: 0.05, precision: " +
          precision + ", loss_scale: 1024, loss_scale_interval: 3" +
          (muon ? ", optimizer: muon" : "") + extra +
          "}\n"
          "memory: {check_every: 0}\n" +
          (shard == "none" ? std::string() : "ddp: {shard: " + shard + ", bucket_mb: 0.002}\n"),
      "host-sync.yaml");
}

std::vector<at::Tensor> parameters(models::Model& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
}

constexpr int64_t kLogEvery = 4;

// Steps 1..12, reading on every 4th only; checks both counters around every step and returns the
// results of the logged steps.
std::vector<train::StepResult> run_logging_every_4th(Trained& run) {
  std::vector<train::StepResult> logged;
  ScalarReadObserver observer;
  for (int64_t s = 1; s <= 12; ++s) {
    const bool log = s % kLogEvery == 0;
    const int64_t reads = run.trainer->host_reads();
    const int64_t scalars = g_scalar_reads.load();
    train::StepResult r = run.trainer->step(s, /*stop_requested=*/false, /*read_metrics=*/log);
    EXPECT_EQ(run.trainer->host_reads() - reads, log ? 1 : 0) << "step " << s;
    if (!log) {
      EXPECT_EQ(g_scalar_reads.load() - scalars, 0)
          << "step " << s << " (not logged) read a scalar from the device";
    }
    EXPECT_EQ(r.metrics_read, log);
    if (log) logged.push_back(r);
  }
  return logged;
}

class HostSync : public ::testing::TestWithParam<std::string> {};

// The parameter: "PRECISION" or "PRECISION/SHARD" (ddp.shard; none when absent), with "+spikes"
// for the loss-spike guard and a spike injected at step 6, "+muon" for gpt under
// train.optimizer: muon.
TEST_P(HostSync, StepsThatLogNothingReadNothingAndReadingLaterChangesNothing) {
  auto world = trainer_test::runtime().world(std::chrono::seconds(60));
  std::string param = GetParam();
  const bool muon = param.ends_with("+muon");
  if (muon) param.resize(param.size() - std::string_view("+muon").size());
  const bool spikes = param.ends_with("+spikes");
  if (spikes) param.resize(param.size() - std::string_view("+spikes").size());
  const std::string precision = param.substr(0, param.find('/'));
  const std::string shard =
      param.find('/') == std::string::npos ? "none" : param.substr(param.find('/') + 1);
  // fp16: an inf on the last rank at step 6, between two logged steps (4 and 8); spikes: a spike
  // there instead, skipped by the guard.
  const std::string extra =
      spikes ? ", skip_spikes: {loss_z: 50, grad_norm_z: 50, window: 3}, inject_spike: '6'"
      : precision == "fp16" ? fmt::format(", inject_nonfinite: '{}:6'", world->size() - 1)
                            : "";
  Trained lazy = make(*world, precision, extra, shard, muon);
  const auto logged = run_logging_every_4th(lazy);

  // The same run, reading after every step, as before the change.
  Trained eager = make(*world, precision, extra, shard, muon);
  std::vector<train::StepResult> every;
  for (int64_t s = 1; s <= 12; ++s) every.push_back(eager.trainer->step(s));
  {  // under ddp.shard parameters the units are gathered only while pinned
    const auto pin_lazy = trainer_test::pin_parameters(*lazy.trainer);
    const auto pin_eager = trainer_test::pin_parameters(*eager.trainer);
    expect_equal(parameters(*lazy.model), parameters(*eager.model));
  }
  ASSERT_EQ(logged.size(), 3u);
  for (size_t i = 0; i < logged.size(); ++i) {
    const auto& e = every[(i + 1) * kLogEvery - 1];
    EXPECT_EQ(logged[i].loss, e.loss) << "logged step " << (i + 1) * kLogEvery;
    EXPECT_EQ(logged[i].grad_norm, e.grad_norm);
    EXPECT_EQ(logged[i].loss_scale, e.loss_scale);
  }
  if (spikes) {
    EXPECT_TRUE(every[5].skipped);
    for (const auto& r : logged) EXPECT_FALSE(r.skipped);
    EXPECT_EQ(lazy.trainer->skipped_steps(), 1);
  }
  if (precision == "fp16" && !spikes) {
    EXPECT_TRUE(every[5].skipped);                         // every rank skipped step 6 ...
    for (const auto& r : logged) EXPECT_FALSE(r.skipped);  // ... which no logged step was
    // 1024 grew after steps 3 (2048); 6 backed off (1024); 9 and 12 grew it again (4096).
    EXPECT_EQ(logged[2].loss_scale, 4096.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, HostSync, ::testing::Values("fp32", "bf16", "fp16"));
// The spike guard judges on the device: its global loss rides in the first bucket's all-reduce
// (replicated) or the norm's (sharded).
INSTANTIATE_TEST_SUITE_P(SpikeGuard, HostSync,
                         ::testing::Values("fp32+spikes", "bf16/gradients+spikes",
                                           "fp16/optimizer+spikes"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });
// Muon: the momentum, the exchange with the owners, Newton-Schulz and the skip of a non-finite
// step (fp16, step 6) all stay on the device, in every sharding mode.
INSTANTIATE_TEST_SUITE_P(Muon, HostSync,
                         ::testing::Values("fp32+muon", "bf16/optimizer+muon",
                                           "fp16/gradients+muon", "fp32/parameters+muon"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });
// Sharded: the norm and the fp16 verdict are combined across ranks on the device, not read.
INSTANTIATE_TEST_SUITE_P(Sharded, HostSync,
                         ::testing::Values("fp32/optimizer", "fp16/optimizer", "fp16/gradients"),
                         [](const auto& info) {
                           std::string n = info.param;
                           n[n.find('/')] = '_';
                           return n;
                         });

}  // namespace TRAINER_UNITY_ID
