// Directories a run writes into (checkpoint.dir, log.tensorboard), checked on rank 0 before step 1
// so that a mistake stops the job at start-up instead of at the first write. Free of LibTorch's
// headers: the TensorBoard writer (built apart from them) uses it too.
#pragma once

#include <string>

namespace io {

// Creates `dir` and its parents where missing. Throws std::invalid_argument
// "KEY = 'DIR': cannot create it: WHY" (also when DIR exists and is not a directory).
void create_output_dir(const std::string& key, const std::string& dir);

// create_output_dir(), then writes and removes a probe file in it. Throws std::invalid_argument
// "KEY = 'DIR': cannot write there: WHY".
void check_output_dir(const std::string& key, const std::string& dir);

}  // namespace io
