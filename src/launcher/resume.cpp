#include "launcher/resume.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

namespace launcher {
namespace {

// The newest checkpoint in `dir` that verifies, passing over damaged ones with a warning each
// (`key` names the setting that led here); nullopt when there is none.
std::optional<train::Checkpoint> newest_in(const std::string& dir, const std::string& key) {
  std::vector<std::string> skipped;
  train::Checkpoint found;
  const std::string path =
      train::newest_good_checkpoint(dir, &skipped, &found, train::ShardedRead::kOpen);
  for (const auto& why : skipped) {
    spdlog::warn("{}: passing over a damaged checkpoint: {}", key, why);
  }
  if (path.empty()) return std::nullopt;
  return found;
}

}  // namespace

std::optional<train::Checkpoint> select_resume(const train::CheckpointOptions& options,
                                               models::Model& model, ResumeFor purpose) {
  const std::string& resume = options.resume;
  const bool file = !resume.empty() && resume != "auto";
  const bool search =
      !file && !options.dir.empty() && (resume == "auto" || purpose == ResumeFor::kWeights);
  if (!file && !search) return std::nullopt;
  // The key whose setting chose the checkpoint, for messages.
  const std::string key = resume.empty() ? "checkpoint.dir" : "checkpoint.resume";
  std::optional<train::Checkpoint> checkpoint;
  try {
    if (file) {
      checkpoint = train::read_checkpoint(resume, train::ShardedRead::kOpen);
    } else {
      checkpoint = newest_in(options.dir, resume.empty() ? key : key + ": auto");
    }
    if (checkpoint) train::check_compatible(*checkpoint, model);
  } catch (const train::CheckpointError& e) {
    throw train::CheckpointError(fmt::format("{}: {}", key, e.what()));
  }
  if (checkpoint) {
    train::apply_model_state(*checkpoint, model);
  } else if (purpose == ResumeFor::kTraining) {
    spdlog::info("checkpoint.resume: auto: no checkpoint in {} yet; starting at step 1",
                 options.dir);
  }
  return checkpoint;
}

bool requeue_resumes(const train::CheckpointOptions& options) {
  return !options.dir.empty() && options.resume == "auto";
}

}  // namespace launcher
