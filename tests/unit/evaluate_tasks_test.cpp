// --evaluate without data (launcher/evaluate_tasks.h): when a run has no data to validate on, and
// the shape its model is built from then.

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "config/config.h"
#include "launcher/evaluate_tasks.h"

namespace launcher {
namespace TRAINER_UNITY_ID {

config::Config lm_config(const std::string& path, const std::string& tasks = "[hellaswag.bin]") {
  return config::parse_config("model:\n  name: gpt\ndata:\n  dataset: tokens\n  path: '" + path +
                                  "'\n  vocab_size: 1093\n  context: 48\ntrain:\n"
                                  "  global_batch_size: 8\neval:\n  tasks: " +
                                  tasks + "\n",
                              "eval.yaml");
}

TEST(EvaluateTasks, OnlyEvaluateWithTasksOnTokenDataGoesWithoutData) {
  test::TempDir dir;
  EXPECT_EQ(missing_validation_data(lm_config(""), true), "data.path is not set");
  EXPECT_EQ(missing_validation_data(lm_config(dir.file("nope")), true),
            "data.path '" + dir.file("nope") + "' does not exist");
  EXPECT_EQ(missing_validation_data(lm_config(dir.path()), true), "");         // there: validated
  EXPECT_EQ(missing_validation_data(lm_config(dir.file("nope")), false), "");  // training
  EXPECT_EQ(missing_validation_data(lm_config(dir.file("nope"), "[]"), true), "");  // no tasks
}

TEST(EvaluateTasks, TheShapeWithoutDataIsTheConfigsTokenKeys) {
  const core::Shape s = shape_without_data(lm_config(""));
  EXPECT_EQ(s.vocab_size, 1093);
  EXPECT_EQ(s.context, 48);
  EXPECT_EQ(s.input_dim, 0);
}

}  // namespace TRAINER_UNITY_ID
}  // namespace launcher
