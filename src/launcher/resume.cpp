#include "launcher/resume.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

namespace launcher {

std::optional<train::Checkpoint> select_resume(const train::CheckpointOptions& options,
                                               models::Model& model) {
  const std::string& resume = options.resume;
  if (resume.empty()) return std::nullopt;
  const bool automatic = resume == "auto";
  std::optional<train::Checkpoint> checkpoint;
  try {
    if (automatic) {
      std::vector<std::string> skipped;
      train::Checkpoint found;
      const std::string path = train::newest_good_checkpoint(options.dir, &skipped, &found);
      for (const auto& why : skipped) {
        spdlog::warn("checkpoint.resume: auto: passing over a damaged checkpoint: {}", why);
      }
      if (!path.empty()) checkpoint = std::move(found);
    } else {
      checkpoint = train::read_checkpoint(resume);
    }
    if (checkpoint) train::check_compatible(*checkpoint, model);
  } catch (const train::CheckpointError& e) {
    throw train::CheckpointError(fmt::format("checkpoint.resume: {}", e.what()));
  }
  if (checkpoint) {
    train::apply_model_state(*checkpoint, model);
  } else {
    spdlog::info("checkpoint.resume: auto: no checkpoint in {} yet; starting at step 1", options.dir);
  }
  return checkpoint;
}

bool requeue_resumes(const train::CheckpointOptions& options) {
  return !options.dir.empty() && options.resume == "auto";
}

}  // namespace launcher
