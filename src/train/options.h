// Options of the training loop (the train and checkpoint sections of the config; every key is
// declared with its default in config/schema_train.cpp, the one place for defaults: the
// initialisers here are only zero values).
//
// A choice key is an enum here, parsed once by the config loader. Each enum's names, as the
// config spells them, are an array indexed by the enum's value (the loader, --print-config and
// --help-config use them; so do messages).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/options.h"
#include "data/loader.h"
#include "ddp/options.h"
#include "memory/options.h"
#include "train/report/progress.h"  // ProgressSetting (log.progress), owned by the report layer

namespace train {

// train.tf32, train.channels_last.
enum class Switch { kAuto, kOn, kOff };
inline constexpr std::array<const char*, 3> kSwitchNames = {"auto", "on", "off"};

// train.skip_spikes (train/spike_guard.h): {loss_z, grad_norm_z, window}; window 0: off.
struct SpikeGuardOptions {
  double loss_z = 0;       // 0: the loss is not judged
  double grad_norm_z = 0;  // 0: the gradient norm is not judged
  int64_t window = 0;      // applied steps the mean and deviation are taken over
  bool enabled() const { return window > 0 && (loss_z > 0 || grad_norm_z > 0); }
};

// train.precision (train/precision.h).
enum class Precision { kFp32, kBf16, kFp16 };
inline constexpr std::array<const char*, 3> kPrecisionNames = {"fp32", "bf16", "fp16"};

// train.schedule (train/schedule.h): the learning rate after warmup.
enum class ScheduleKind { kCosine, kLinear, kConstant, kWsd };
inline constexpr std::array<const char*, 4> kScheduleNames = {"cosine", "linear", "constant",
                                                              "wsd"};
// train.decay_shape: the shape of wsd's decay stage.
enum class DecayShape { kLinear, kCosine, kOneMinusSqrt };
inline constexpr std::array<const char*, 3> kDecayShapeNames = {"linear", "cosine", "1-sqrt"};

// train.optimizer (train/optimizer.h, train/muon.h).
enum class OptimizerKind { kAdamW, kMuon };
inline constexpr std::array<const char*, 2> kOptimizerNames = {"adamw", "muon"};
// train.muon_adjust_lr: Muon's shape-based learning-rate adjustment (torch.optim.Muon's
// adjust_lr_fn): original, sqrt(max(1, rows / cols)); match_rms_adamw, 0.2 sqrt(max(rows, cols)).
enum class MuonAdjustLr { kOriginal, kMatchRmsAdamW };
inline constexpr std::array<const char*, 2> kMuonAdjustLrNames = {"original", "match_rms_adamw"};
// train.muon_ns_dtype: the dtype Newton-Schulz runs in (auto: as torch.optim.Muon, bf16, except
// under train.precision fp16, where it is the compute dtype fp16).
enum class MuonNsDtype { kAuto, kFp32, kBf16, kFp16 };
inline constexpr std::array<const char*, 4> kMuonNsDtypeNames = {"auto", "fp32", "bf16", "fp16"};

// train.objective (train/objective.h): lm, next-token cross-entropy over the targets; dpo and
// simpo, preference objectives over pairs (data with NAME.pairs: a sample is a pair).
enum class ObjectiveKind { kLm, kDpo, kSimpo };
inline constexpr std::array<const char*, 3> kObjectiveNames = {"lm", "dpo", "simpo"};

// The preference objectives' constants (train.dpo_*, train.simpo_*).
struct PreferenceOptions {
  double dpo_beta = 0;
  double dpo_label_smoothing = 0;  // 0: the sigmoid loss; above 0: cDPO's robust form
  double simpo_beta = 0;
  double simpo_gamma = 0;  // the target reward margin
};

// Muon's group (train.optimizer: muon): the hidden layers' 2-D weight matrices.
struct MuonOptions {
  double lr = 0;  // peak learning rate (the schedule scales it as it scales train.lr)
  double weight_decay = 0;
  double momentum = 0;
  bool nesterov = false;
  int64_t ns_steps = 0;
  MuonAdjustLr adjust_lr{};
  MuonNsDtype ns_dtype{};
};

struct TrainOptions {
  std::string device;  // auto | cpu | cuda
  int64_t global_batch_size = 0;
  int64_t micro_batch_size = 0;  // 0: auto
  int64_t steps = 0;
  double lr = 0;  // AdamW's peak learning rate (every parameter, or Muon's others)
  double min_lr_ratio = 0;
  int64_t warmup_steps = 0;
  ScheduleKind schedule{};    // cosine | linear | constant | wsd (train/schedule.h)
  double decay_fraction = 0;  // wsd: the fraction of train.steps its decay takes
  DecayShape decay_shape{};   // wsd: linear | cosine | 1-sqrt
  OptimizerKind optimizer{};  // adamw | muon
  MuonOptions muon{};         // train.muon_*: Muon's group
  double weight_decay = 0;    // AdamW's
  ObjectiveKind objective{};  // lm | dpo | simpo (train/objective.h)
  PreferenceOptions preference{};
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double grad_clip = 0;  // 0: no clipping
  uint64_t seed = 0;
  int64_t threads = 0;       // 0: cores / local ranks
  int64_t eval_every = 0;    // validation metrics every N steps (0: after the last step only)
  int64_t eval_samples = 0;  // validation samples evaluated (0: the whole split)
  // eval.tasks: multiple-choice task files evaluated with validation (data/choice_tasks.h). The
  // config's `eval` section; the field sits here with the other evaluation settings.
  std::vector<std::string> eval_tasks;
  Precision precision{};  // fp32 | bf16 | fp16 (train/precision.h)
  double loss_scale = 0;  // fp16: initial loss scale (train/loss_scaler.h)
  double loss_scale_growth = 0;
  double loss_scale_backoff = 0;
  int64_t loss_scale_interval = 0;
  int64_t max_skipped_steps = 0;    // consecutive skipped steps that end the job
  std::string inject_nonfinite;     // test hook: "RANK:STEP[;RANK:STEP...]" makes that rank's
                                    // gradient non-finite at that step
  SpikeGuardOptions skip_spikes{};  // the loss-spike guard (train/spike_guard.h)
  std::string inject_spike;         // test hook: "STEP[;STEP...]" multiplies that step's loss
  Switch tf32{};                    // auto | on | off
  bool cudnn_benchmark = false;
  Switch channels_last{};         // auto | on | off (models that convolve)
  bool cuda_graphs = false;       // capture forward + backward as a CUDA graph (train/graph_step.h)
  double peak_tflops = 0;         // MFU's denominator (0: a table of known GPUs)
  int64_t sample_every = 0;       // gpt: rank 0 logs a generated sample every N steps (0: never)
  std::string sample_prompt;      // its prompt (empty: the start of the first validation sequence)
  int64_t sample_tokens = 0;      // new tokens per sample
  double sample_temperature = 0;  // the samples' temperature (0: greedy)
  int64_t sample_top_k = 0;       // the samples draw among the K most likely ids (0: all)
};

struct LogOptions {
  std::string level;
  int64_t every = 0;
  // JSON Lines file (train/report/metrics.h); "": checkpoint.dir/metrics.jsonl; "off": none
  std::string metrics;
  ProgressSetting progress{};  // auto | bar | lines | off (train/report/progress.h)
  // directory for TensorBoard event files (train/report/tensorboard.h); "": none
  std::string tensorboard;
  // directory for a profiler trace of steps profile_from .. profile_from + profile_steps - 1
  // (train/profiler.h); "": none
  std::string profile;
  int64_t profile_from = 0;
  int64_t profile_steps = 0;
};

// Everything the Trainer is configured with.
struct TrainerOptions {
  TrainOptions train;
  ddp::DdpOptions ddp;
  memory::MemoryOptions memory;
  checkpoint::CheckpointOptions checkpoint;
  LogOptions log;
  data::LoaderOptions loader;  // pin_memory is decided by the Trainer (GPU runs)
};

}  // namespace train
