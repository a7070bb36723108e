// Logging that knows its rank: every line says time, rank/world and level. Rank 0 speaks for the
// job at log.level; other ranks log only warnings and errors (their own trouble).
#pragma once

#include <string>

namespace launcher {

void setup_logging(int rank, int world_size, const std::string& level);

}  // namespace launcher
