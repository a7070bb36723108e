#include "launcher/resume.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "checkpoint/files.h"
#include "checkpoint/read.h"
#include "models/capabilities.h"

namespace launcher {
namespace {

// The newest checkpoint in `dir` that verifies, passing over damaged ones with a warning each
// (`key` names the setting that led here); nullopt when there is none.
std::optional<checkpoint::Checkpoint> newest_in(const std::string& dir, const std::string& key) {
  std::vector<std::string> skipped;
  checkpoint::Checkpoint found;
  const std::string path =
      checkpoint::newest_good_checkpoint(dir, &skipped, &found, checkpoint::ShardedRead::kOpen);
  for (const auto& why : skipped) {
    spdlog::warn("{}: passing over a damaged checkpoint: {}", key, why);
  }
  if (path.empty()) return std::nullopt;
  return found;
}

// The moments a checkpoint for training must hold: Muon's for the hidden matrices under muon
// (none where the model names none: the Trainer then refuses train.optimizer: muon), AdamW's for
// the rest; any optimizer's where only the weights are used.
std::optional<std::vector<std::string>> moments_for(models::Model& model, ResumeFor purpose,
                                                    train::OptimizerKind optimizer) {
  if (purpose == ResumeFor::kWeights) return std::nullopt;
  const auto* hidden = models::as<models::HiddenMatrices>(model);
  if (optimizer != train::OptimizerKind::kMuon || hidden == nullptr) {
    return std::vector<std::string>{};
  }
  return models::hidden_parameters(*hidden);
}

// A training run whose checkpoint.dir holds another model's checkpoints would write its own among
// them, and its final checkpoint over theirs: refused (exit 2), naming the newest of them (read
// by its header alone) and how it differs. A directory of this model's checkpoints, or of damaged
// ones (resume "auto" reports those), passes.
void check_dir_holds_this_model(const std::string& dir, models::Model& model) {
  for (const auto& path : checkpoint::checkpoints_newest_first(dir)) {
    checkpoint::Checkpoint header;
    try {
      header = checkpoint::read_checkpoint_header(path);
    } catch (const checkpoint::CheckpointError&) {
      continue;  // damaged: not evidence of another model
    }
    try {
      checkpoint::check_compatible(header, model, std::nullopt);
    } catch (const checkpoint::CheckpointError& e) {
      throw checkpoint::CheckpointError(fmt::format(
          "checkpoint.dir: {} holds another model's checkpoint: {}. This run would write its "
          "checkpoints among that run's (its final one over theirs): give it a checkpoint.dir of "
          "its own",
          dir, e.what()));
    }
    return;
  }
}

}  // namespace

std::optional<checkpoint::Checkpoint> select_resume(const checkpoint::CheckpointOptions& options,
                                                    models::Model& model, ResumeFor purpose,
                                                    train::OptimizerKind optimizer) {
  const std::string& resume = options.resume;
  const bool file = !resume.empty() && resume != "auto";
  const bool search =
      !file && !options.dir.empty() && (resume == "auto" || purpose == ResumeFor::kWeights);
  if (purpose == ResumeFor::kTraining && !options.dir.empty() && resume != "auto") {
    check_dir_holds_this_model(options.dir, model);  // "auto" checks the one it takes, below
  }
  if (!file && !search) return std::nullopt;
  // The key whose setting chose the checkpoint, for messages.
  const std::string key = resume.empty() ? "checkpoint.dir" : "checkpoint.resume";
  std::optional<checkpoint::Checkpoint> chosen;
  try {
    if (file) {
      chosen = checkpoint::read_checkpoint(resume, checkpoint::ShardedRead::kOpen);
    } else {
      chosen = newest_in(options.dir, resume.empty() ? key : key + ": auto");
    }
    if (chosen)
      checkpoint::check_compatible(*chosen, model, moments_for(model, purpose, optimizer));
  } catch (const checkpoint::CheckpointError& e) {
    throw checkpoint::CheckpointError(fmt::format("{}: {}", key, e.what()));
  }
  if (chosen) {
    checkpoint::apply_model_state(*chosen, model);
  } else if (purpose == ResumeFor::kTraining) {
    spdlog::info("checkpoint.resume: auto: no checkpoint in {} yet; starting at step 1",
                 options.dir);
  }
  return chosen;
}

bool requeue_resumes(const checkpoint::CheckpointOptions& options) {
  return !options.dir.empty() && options.resume == "auto";
}

}  // namespace launcher
