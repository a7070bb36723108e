// The train, checkpoint and log sections' keys (train::TrainOptions, CheckpointOptions,
// LogOptions in train/options.h), each declared once with its default.

#include "config/key_builders.h"
#include "train/loss_scaler.h"
#include "train/options.h"
#include "train/spike_guard.h"

namespace config::schema {
namespace {

// train.skip_spikes: off, or {loss_z, grad_norm_z, window} with each key left out at its
// default (6, 6, 100); a z of 0 leaves that value unjudged.
KeyDef skip_spikes_key() {
  using train::SpikeGuardOptions;
  const SpikeGuardOptions defaults{6.0, 6.0, 100};
  return {"train.skip_spikes",
          "map",
          "off",
          "off | {loss_z, grad_norm_z, window}",
          "the loss-spike guard: a step whose loss or gradient norm is more than z standard "
          "deviations above the mean of the last `window` applied steps is skipped (defaults "
          "6, 6, 100; z 0: not judged)",
          false,
          [=](Config& c, const YAML::Node& n) {
            if (n.IsScalar() && (n.Scalar() == "off" || n.Scalar() == "false")) {
              c.train.skip_spikes = {};
              return;
            }
            if (!n.IsMap()) {
              throw ValueError(fmt::format(
                  "expected off or a map {{loss_z, grad_norm_z, window}}, got {}", kind_of(n)));
            }
            SpikeGuardOptions o = defaults;
            for (const auto& entry : n) {
              if (!entry.first.IsScalar()) throw ValueError("expected loss_z, grad_norm_z, window");
              const std::string key = entry.first.Scalar();
              try {
                if (key == "loss_z" || key == "grad_norm_z") {
                  const double z = parse_real(entry.second);
                  if (z < 0) throw ValueError(fmt::format("{} is below 0", z));
                  (key == "loss_z" ? o.loss_z : o.grad_norm_z) = z;
                } else if (key == "window") {
                  o.window = parse_int(entry.second);
                  if (o.window < 2) throw ValueError(fmt::format("{} is below 2", o.window));
                } else {
                  throw ValueError("unknown key (expected loss_z, grad_norm_z, window)");
                }
              } catch (const ValueError& e) {
                throw ValueError(fmt::format("{}: {}", key, e.what()));
              }
            }
            if (!o.enabled()) {
              throw ValueError("loss_z and grad_norm_z are both 0: nothing would be judged (write "
                               "train.skip_spikes: off)");
            }
            c.train.skip_spikes = o;
          },
          [](const Config& c) {
            const SpikeGuardOptions& o = c.train.skip_spikes;
            if (!o.enabled()) return std::string("off");
            return fmt::format("{{loss_z: {}, grad_norm_z: {}, window: {}}}", o.loss_z,
                               o.grad_norm_z, o.window);
          }};
}

// What the run is: device, batch, steps, the optimizer and its schedule, seed, threads.
std::vector<KeyDef> run_keys() {
  return {
      choice("train.device", FIELD(train.device), "auto", {"auto", "cpu", "cuda"},
             "auto: a GPU per rank where GPUs are visible, else CPU"),
      integer("train.global_batch_size", FIELD(train.global_batch_size), "", 1, 1LL << 31,
              "samples per optimizer step across all ranks"),
      integer_or_auto("train.micro_batch_size", FIELD(train.micro_batch_size), "auto",
                      "samples per forward/backward on a rank (auto: the largest that fits "
                      "memory.target_fraction, at most the per-rank batch)"),
      integer("train.steps", FIELD(train.steps), "100", 1, kMax, "optimizer steps to train"),
      real("train.lr", FIELD(train.lr), "0.001", 0.0, 10.0, true, false,
           "peak learning rate (AdamW)"),
      real("train.min_lr_ratio", FIELD(train.min_lr_ratio), "0.1", 0.0, 1.0, false, false,
           "final learning rate as a fraction of the peak (the schedule's decay)"),
      integer("train.warmup_steps", FIELD(train.warmup_steps), "10", 0, kMax,
              "steps of linear warmup"),
      real("train.weight_decay", FIELD(train.weight_decay), "0.01", 0.0, 10.0, false, false,
           "AdamW decoupled weight decay"),
      real("train.beta1", FIELD(train.beta1), "0.9", 0.0, 1.0, false, true, "AdamW beta1"),
      real("train.beta2", FIELD(train.beta2), "0.999", 0.0, 1.0, false, true, "AdamW beta2"),
      real("train.eps", FIELD(train.eps), "1e-08", 0.0, 1.0, true, false, "AdamW epsilon"),
      real("train.grad_clip", FIELD(train.grad_clip), "1.0", 0.0, kInf, false, true,
           "clip the global gradient norm to this (0: no clipping)"),
      seed("train.seed", FIELD(train.seed), "42", "seed of initialisation and data order"),
      integer("train.threads", FIELD(train.threads), "0", 0, 4096,
              "CPU threads per rank (0: the rank's share of the node's cores, binding the rank "
              "to them where the launcher bound it to fewer; set: the launcher's binding stands)"),
      integer("train.eval_every", FIELD(train.eval_every), "0", 0, kMax,
              "log validation metrics every N steps (0: after the last step only): the loss on "
              "the validation split (tokens, csv, images; PSNR too for images), HR@10 and "
              "NDCG@10 (movielens)")};
}

// The learning-rate schedule and the optimizer's groups (train/schedule.h, train/muon.h).
std::vector<KeyDef> optimizer_keys() {
  return {
      enum_choice("train.schedule", FIELD(train.schedule), "cosine", train::kScheduleNames,
                  "after warmup: cosine or linear decay to train.min_lr_ratio at the last step, "
                  "constant, or wsd (warmup-stable-decay: the peak until the decay of the last "
                  "train.decay_fraction of the steps)"),
      real("train.decay_fraction", FIELD(train.decay_fraction), "0.2", 0.0, 1.0, false, false,
           "wsd: the fraction of train.steps its decay takes (the last steps)"),
      enum_choice("train.decay_shape", FIELD(train.decay_shape), "1-sqrt", train::kDecayShapeNames,
                  "wsd: the decay's shape from the peak to train.min_lr_ratio (1-sqrt: 1 - "
                  "sqrt(progress))"),
      enum_choice("train.optimizer", FIELD(train.optimizer), "adamw", train::kOptimizerNames,
                  "adamw: every parameter; muon: Muon (momentum orthogonalised by Newton-Schulz) "
                  "for the hidden layers' 2-D weight matrices, AdamW (train.lr, "
                  "train.weight_decay) for embeddings, output layer, norms and biases (gpt, "
                  "llama)"),
      real("train.muon_lr", FIELD(train.muon.lr), "0.02", 0.0, 10.0, true, false,
           "muon: peak learning rate of the Muon group (the schedule scales it as train.lr)"),
      real("train.muon_weight_decay", FIELD(train.muon.weight_decay), "0.01", 0.0, 10.0, false,
           false, "muon: decoupled weight decay of the Muon group"),
      real("train.muon_momentum", FIELD(train.muon.momentum), "0.95", 0.0, 1.0, false, true,
           "muon: momentum of the Muon group"),
      boolean("train.muon_nesterov", FIELD(train.muon.nesterov), "true",
              "muon: Nesterov momentum (orthogonalise grad + momentum * buffer)"),
      integer("train.muon_ns_steps", FIELD(train.muon.ns_steps), "5", 1, 99,
              "muon: Newton-Schulz iterations (quintic, coefficients 3.4445, -4.7750, 2.0315)"),
      enum_choice("train.muon_adjust_lr", FIELD(train.muon.adjust_lr), "original",
                  train::kMuonAdjustLrNames,
                  "muon: the learning rate of an A x B matrix times sqrt(max(1, A / B)) "
                  "(original) or 0.2 sqrt(max(A, B)) (match_rms_adamw)"),
      enum_choice("train.muon_ns_dtype", FIELD(train.muon.ns_dtype), "auto",
                  train::kMuonNsDtypeNames,
                  "muon: the dtype Newton-Schulz runs in (auto: bf16 as torch.optim.Muon, fp16 "
                  "under train.precision fp16)")};
}

// Numerics and speed: precision and fp16's loss scaling, TF32, cuDNN, memory format, graphs.
// The objective: next-token cross-entropy, or a preference objective over pairs
// (train/objective.h).
std::vector<KeyDef> objective_keys() {
  return {
      enum_choice("train.objective", FIELD(train.objective), "lm", train::kObjectiveNames,
                  "lm: next-token cross-entropy; dpo, simpo: preference tuning on pairs (shards "
                  "with NAME.pairs, scripts/tokenize_text.py --preference)"),
      real("train.dpo_beta", FIELD(train.preference.dpo_beta), "0.1", 0.0, 1e3, true, false,
           "dpo: beta, the strength of the reference's hold (TRL's default)"),
      real("train.dpo_label_smoothing", FIELD(train.preference.dpo_label_smoothing), "0", 0.0, 0.5,
           false, true,
           "dpo: the probability that a pair's labels are flipped (0: the sigmoid loss; above "
           "0: cDPO's robust form, as TRL computes it)"),
      real("train.simpo_beta", FIELD(train.preference.simpo_beta), "2.0", 0.0, 1e3, true, false,
           "simpo: beta, the scale of the length-normalised rewards"),
      real("train.simpo_gamma", FIELD(train.preference.simpo_gamma), "0.5", 0.0, 1e3, false, false,
           "simpo: gamma, the target reward margin (TRL's simpo_gamma)")};
}

std::vector<KeyDef> numerics_keys() {
  return {
      enum_choice("train.precision", FIELD(train.precision), "fp32", train::kPrecisionNames,
                  "bf16 / fp16: forward and loss under autocast (bfloat16 / float16 matmuls and "
                  "convolutions); parameters, gradients, all-reduce and AdamW stay fp32; fp16 "
                  "adds dynamic loss scaling"),
      real("train.loss_scale", FIELD(train.loss_scale), "65536", 1.0, 1e30, false, false,
           "fp16: initial loss scale"),
      real("train.loss_scale_growth", FIELD(train.loss_scale_growth), "2.0", 1.0, 1e6, false, false,
           "fp16: factor the scale grows by after train.loss_scale_interval finite steps in a "
           "row"),
      real("train.loss_scale_backoff", FIELD(train.loss_scale_backoff), "0.5", 0.0, 1.0, true, true,
           "fp16: factor the scale shrinks by after a step with a non-finite gradient (the step "
           "is skipped)"),
      integer("train.loss_scale_interval", FIELD(train.loss_scale_interval), "2000", 1, kMax,
              "fp16: finite steps in a row before the scale grows"),
      integer("train.max_skipped_steps", FIELD(train.max_skipped_steps), "50", 1, kMax,
              "this many skipped steps in a row (non-finite, or spikes under train.skip_spikes) "
              "end the job with a message and a checkpoint of the last good state"),
      checked_text("train.inject_nonfinite", FIELD(train.inject_nonfinite),
                   "test hook: 'RANK:STEP[; RANK:STEP ...]' makes that rank's gradient non-finite "
                   "at that step",
                   [](const std::string& v) { train::parse_nonfinite_injections(v); }),
      skip_spikes_key(),
      checked_text("train.inject_spike", FIELD(train.inject_spike),
                   "test hook: 'STEP[; STEP ...]' multiplies that step's loss (and so its "
                   "gradients) by 1000 on every rank",
                   [](const std::string& v) { train::parse_spike_injections(v); }),
      enum_choice("train.tf32", FIELD(train.tf32), "auto", train::kSwitchNames,
                  "CUDA: TF32 matmuls and convolutions (auto: on Ampere and newer)"),
      boolean("train.cudnn_benchmark", FIELD(train.cudnn_benchmark), "false",
              "CUDA: let cuDNN time its algorithms for each new input shape (fixed shapes: "
              "faster)"),
      enum_choice("train.channels_last", FIELD(train.channels_last), "auto", train::kSwitchNames,
                  "cnn: convolutions in channels-last (NHWC) memory format, which cuDNN's "
                  "tensor-core kernels want (auto: on a GPU)"),
      boolean("train.cuda_graphs", FIELD(train.cuda_graphs), "false",
              "CUDA: capture forward + backward of a micro-batch as a CUDA graph after warm-up "
              "and replay it (launch overhead gone); falls back to eager, saying why, where "
              "capture cannot work")};
}

// What the run reports beside the loss: MFU, text samples, evaluation.
std::vector<KeyDef> report_keys() {
  return {
      real("train.peak_tflops", FIELD(train.peak_tflops), "0", 0.0, 1e6, false, false,
           "the device's dense peak TFLOP/s for MFU in the log (0: known GPUs by name: H100, "
           "H200, A100, L40S)"),
      integer("train.sample_every", FIELD(train.sample_every), "0", 0, kMax,
              "gpt, llama and its kin: rank 0 logs a sample of generated text every N steps (fixed "
              "seed, eval mode; "
              "the training result is unchanged; 0: never)"),
      text("train.sample_prompt", FIELD(train.sample_prompt), "",
           "gpt, llama and its kin: the samples' prompt (empty: the first 16 tokens of the first "
           "validation "
           "sequence, else training sequence)"),
      integer(
          "train.sample_tokens", FIELD(train.sample_tokens), "64", 1, 1 << 20,
          "gpt, llama and its kin: new tokens per sample (at most until model.context is full)"),
      real("train.sample_temperature", FIELD(train.sample_temperature), "0.8", 0.0, kInf, false,
           true,
           "gpt, llama and its kin: the samples' temperature (0: greedy, the most likely token "
           "every time)"),
      integer("train.sample_top_k", FIELD(train.sample_top_k), "200", 0, kMax,
              "gpt, llama and its kin: the samples draw among the K most likely tokens (0: all)"),
      integer("train.eval_samples", FIELD(train.eval_samples), "1024", 0, kMax,
              "validation samples evaluated each time, the first of the split (0: all)")};
}

}  // namespace

std::vector<KeyDef> train_keys() {
  std::vector<KeyDef> keys = run_keys();
  for (const auto& part : {optimizer_keys(), objective_keys(), numerics_keys(), report_keys()}) {
    keys.insert(keys.end(), part.begin(), part.end());
  }
  return keys;
}

std::vector<KeyDef> eval_keys() {
  return {text_list("eval.tasks", FIELD(train.eval_tasks), "[]",
                    "multiple-choice task files (llm.c's HellaSwag .bin, or JSON Lines) evaluated "
                    "every train.eval_every steps and at the end; gpt and llama only")};
}

std::vector<KeyDef> checkpoint_keys() {
  return {
      text("checkpoint.dir", FIELD(checkpoint.dir), "", "directory for checkpoints (empty: none)"),
      integer("checkpoint.every", FIELD(checkpoint.every), "0", 0, kMax,
              "save every N steps (0: only at the end)"),
      integer("checkpoint.keep_last", FIELD(checkpoint.keep_last), "0", 0, kMax,
              "keep only the newest N periodic checkpoints, deleting older ones after a new one "
              "is complete (0: keep all)"),
      text("checkpoint.resume", FIELD(checkpoint.resume), "",
           "resume from this checkpoint file; 'auto': the newest in checkpoint.dir that "
           "verifies, if any (empty: start fresh)"),
      enum_choice("checkpoint.format", FIELD(checkpoint.format), "auto", checkpoint::kFormatNames,
                  "sharded: every rank writes its own shard of the parameters and optimizer state "
                  "into a step directory with a manifest (no gather); single: rank 0 gathers and "
                  "writes one file; auto: sharded when ddp.shard is not none, else single"),
      boolean("checkpoint.async", FIELD(checkpoint.async), "true",
              "the step waits only for the copy to host memory; a background thread writes and "
              "fsyncs the files, and the next checkpoint or the end of the run waits for it and "
              "commits it (false: the step waits for the whole write)"),
      integer("checkpoint.max_failed_writes", FIELD(checkpoint.max_failed_writes), "3", 1, kMax,
              "periodic checkpoints that may fail in a row for want of space (ENOSPC, EDQUOT: "
              "warned, their partial files deleted, training goes on) before the job stops "
              "with exit code 5")};
}

std::vector<KeyDef> log_keys() {
  return {
      choice("log.level", FIELD(log.level), "info", {"trace", "debug", "info", "warn", "error"},
             "log level of rank 0 (other ranks log warnings and errors)"),
      integer("log.every", FIELD(log.every), "10", 1, kMax, "log a step line every N steps"),
      text("log.metrics", FIELD(log.metrics), "",
           "JSON Lines file with a record per logged step and evaluation (empty: "
           "checkpoint.dir/metrics.jsonl when checkpoint.dir is set; off: none)"),
      enum_choice("log.progress", FIELD(log.progress), "auto", train::kProgressSettingNames,
                  "rank 0's progress: bar (a live bar on stderr: steps, samples/s, loss, ETA; "
                  "step lines still logged above it), lines (an ETA at the end of each step "
                  "line), off (neither); auto: bar when stderr is a terminal, else lines (under "
                  "mpirun a rank's stderr is a pipe: lines)"),
      text("log.tensorboard", FIELD(log.tensorboard), "",
           "directory for TensorBoard event files (rank 0 writes each logged step's and "
           "evaluation's numbers as scalars; created if missing; empty: none)"),
      text("log.profile", FIELD(log.profile), "",
           "directory for a profiler trace (Chrome/Perfetto JSON, trace_rank<R>.json per rank, "
           "as torch.profiler writes) of steps log.profile_from .. + log.profile_steps - 1; "
           "bench/profile_summary.py sums it per phase and operator (empty: none)"),
      integer("log.profile_from", FIELD(log.profile_from), "3", 1, kMax,
              "first step of the profiler trace (the first steps warm up allocators and caches)"),
      integer("log.profile_steps", FIELD(log.profile_steps), "5", 1, 10000,
              "number of steps in the profiler trace")};
}

}  // namespace config::schema
