#include "launcher/evaluate_tasks.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "train/choice_evaluation.h"

namespace launcher {

int evaluate_tasks_only(Startup& s) {
  if (s.rank == 0) {
    spdlog::info("validation loss skipped: {} (--evaluate scores eval.tasks without data)",
                 s.no_data);
  }
  const int64_t step = s.resume_from ? s.resume_from->meta.step : 0;  // rank 0 holds it, and logs
  for (const data::ChoiceTask& task : s.eval_inputs.tasks) {
    const train::ChoiceCounts counts = train::evaluate_choice_task(*s.control, *s.model, task);
    if (s.rank == 0) spdlog::info("eval step {}: {}", step, train::choice_line(counts));
  }
  s.control->barrier("shutdown");
  return kExitOk;
}

}  // namespace launcher
