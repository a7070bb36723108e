#include "launcher/resume.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

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

}  // namespace

std::optional<checkpoint::Checkpoint> select_resume(const checkpoint::CheckpointOptions& options,
                                                    models::Model& model, ResumeFor purpose,
                                                    train::OptimizerKind optimizer) {
  const std::string& resume = options.resume;
  const bool file = !resume.empty() && resume != "auto";
  const bool search =
      !file && !options.dir.empty() && (resume == "auto" || purpose == ResumeFor::kWeights);
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
