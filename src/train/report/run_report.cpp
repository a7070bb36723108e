#include "train/report/run_report.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "memory/memory_stats.h"
#include "memory/process_memory.h"

namespace train {

RunReport::RunReport(ddp::Communicator& control, const ReportOptions& options, c10::Device device,
                     RunFacts facts, int64_t start_step)
    : control_(control), device_(device), facts_(facts),
      progress_(progress_mode(options.progress, control.rank(), isatty(STDERR_FILENO) == 1),
                start_step, facts.steps, facts.global_batch) {
  metrics_on_ = !options.metrics_path.empty();
  if (metrics_on_ && control_.rank() == 0) metrics_ = MetricsFile(options.metrics_path, start_step);
  tensorboard_on_ = !options.tensorboard.empty();
  if (tensorboard_on_ && control_.rank() == 0) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(options.tensorboard, start_step + 1);
  }
}

std::string RunReport::throughput(double samples_per_s) const {
  if (facts_.positions <= 0) return "";
  const double tokens_per_s = samples_per_s * static_cast<double>(facts_.positions);
  std::string text = fmt::format(" {:.0f} tokens/s", tokens_per_s);
  if (facts_.flops_per_token > 0 && facts_.peak_tflops > 0) {
    // Every rank's share: the job's tokens/s over the job's peak.
    text += fmt::format(" MFU {:.1f}%", 100.0 * tokens_per_s * facts_.flops_per_token /
                                            (facts_.peak_tflops * 1e12 * facts_.world_size));
  }
  return text;
}

namespace {

// A preference objective's accuracy and margin for the step line (metrics.jsonl and TensorBoard
// get all of its metrics): " accuracies 0.7500 margins 0.1234"; "" for lm.
std::string objective_text(const StepResult& r) {
  std::string text;
  for (const auto& [name, value] : r.objective) {
    if (name == "rewards/margins" || name == "rewards/accuracies") {
      text += fmt::format(" {} {:.4f}", name.substr(name.find('/') + 1), value);
    }
  }
  return text;
}

}  // namespace

void RunReport::step(int64_t step, const StepResult& r, int64_t window_steps, double elapsed_s,
                     double data_wait_s, int64_t micro_batch, int fallbacks,
                     int64_t skipped_steps) {
  const double samples_per_s = window_steps * facts_.global_batch / elapsed_s;
  spdlog::info("step {:>5}/{} loss {:.4f}{} lr {:.3e} grad_norm {:.3f}{}{} {:>9.1f} samples/s{} "
               "data wait {:.0f}% rss {:.0f} MiB{}",
               step, facts_.steps, r.loss, objective_text(r), r.lr, r.grad_norm,
               r.loss_scale > 0 ? fmt::format(" scale {:g}", r.loss_scale) : "",
               skipped_steps > 0 ? fmt::format(" skipped {}", skipped_steps) : "", samples_per_s,
               throughput(samples_per_s), 100.0 * data_wait_s / elapsed_s,
               memory::sample_process_memory().resident_bytes / 1048576.0, progress_.eta_suffix());
  progress_.set_loss(r.loss);
  if (!metrics_on_ && !tensorboard_on_) return;
  // Every rank's peak since the last memory table, for rank 0's record.
  at::Tensor peaks = at::empty({control_.size()}, at::kDouble);
  control_.all_gather(
      peaks,
      at::tensor({static_cast<double>(memory::sample_memory(device_).tensor_peak_bytes)},
                 at::kDouble),
      "metrics memory peaks");
  if (control_.rank() != 0) return;
  std::vector<double> mib;
  for (int64_t i = 0; i < peaks.numel(); ++i) mib.push_back(peaks[i].item<double>() / 1048576.0);
  const double tokens_per_s = samples_per_s * static_cast<double>(facts_.positions);
  if (tensorboard_) {
    // The metrics record's numbers, as TensorBoard scalars (grouped by the tags' prefixes).
    Scalars scalars = {{"train/loss", r.loss},
                       {"train/lr", r.lr},
                       {"train/grad_norm", r.grad_norm},
                       {"train/samples_per_s", samples_per_s},
                       {"train/micro_batch", static_cast<double>(micro_batch)},
                       {"train/fallbacks", static_cast<double>(fallbacks)},
                       {"train/skipped_steps", static_cast<double>(skipped_steps)}};
    if (facts_.positions > 0) scalars.emplace_back("train/tokens_per_s", tokens_per_s);
    if (r.loss_scale > 0) scalars.emplace_back("train/loss_scale", r.loss_scale);
    for (const auto& [name, value] : r.objective) scalars.emplace_back("train/" + name, value);
    for (size_t i = 0; i < mib.size(); ++i)
      scalars.emplace_back(fmt::format("memory/rank_{}_mib", i), mib[i]);
    tensorboard_->write(step, scalars);
  }
  if (!metrics_.enabled()) return;
  nlohmann::json rec = {
      {"type", "step"},
      {"step", step},
      {"epoch", static_cast<double>(step) / static_cast<double>(facts_.steps_per_epoch)},
      {"loss", r.loss},
      {"lr", r.lr},
      {"grad_norm", r.grad_norm},
      {"samples_per_s", samples_per_s},
      {"micro_batch", micro_batch},
      {"fallbacks", fallbacks},
      {"skipped_steps", skipped_steps},
      {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()}};
  if (facts_.positions > 0) rec["tokens_per_s"] = tokens_per_s;
  if (r.loss_scale > 0) rec["loss_scale"] = r.loss_scale;
  for (const auto& [name, value] : r.objective) rec[name] = value;
  rec["memory_peak_mib"] = mib;
  metrics_.write(rec);
}

void RunReport::eval(int64_t step, const ValidationMetrics& m) {
  if (m.samples == 0 && m.tasks.empty()) return;
  if (tensorboard_) {
    Scalars scalars;
    for (const auto& [name, value] : m.means) scalars.emplace_back("eval/" + name, value);
    for (const ChoiceCounts& t : m.tasks) {
      const double n = std::max<double>(1.0, static_cast<double>(t.examples));
      scalars.emplace_back("eval/" + t.name + "/acc", static_cast<double>(t.acc) / n);
      scalars.emplace_back("eval/" + t.name + "/acc_norm", static_cast<double>(t.acc_norm) / n);
    }
    tensorboard_->write(step, scalars);
  }
  if (!metrics_.enabled()) return;
  nlohmann::json rec = {
      {"type", "eval"},
      {"step", step},
      {"samples", m.samples},
      {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()}};
  for (const auto& [name, value] : m.means) rec[name] = value;
  for (const ChoiceCounts& t : m.tasks) {
    rec[t.name] = {{"acc", t.acc}, {"acc_norm", t.acc_norm}, {"examples", t.examples}};
  }
  metrics_.write(rec);
}

std::string done_line(const RunSummary& summary, int64_t start_step) {
  std::string aside;
  for (const auto& [bucket, seconds] : summary.aside) {
    aside += fmt::format("{}{} {:.1f} s", aside.empty() ? "" : ", ", bucket, seconds);
  }
  return fmt::format(
      "done: {} steps{}, loss {:.4f} -> {:.4f}, {:.1f} samples/s{} in training{}, {} "
      "memory fallback(s){}",
      summary.steps_done,
      start_step > 0 ? fmt::format(" ({} in this run)", summary.steps_done - start_step) : "",
      summary.first_loss, summary.last_loss, summary.samples_per_s, summary.throughput,
      aside.empty() ? "" : " (" + aside + " apart)", summary.fallbacks,
      summary.skipped_steps > 0 ? fmt::format(", {} step(s) skipped", summary.skipped_steps) : "");
}

}  // namespace train
