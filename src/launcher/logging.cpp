#include "launcher/logging.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace launcher {

void setup_logging(int rank, int world_size, const std::string& level) {
  auto logger = spdlog::stdout_logger_mt(fmt::format("rank{}", rank));
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [{}/{}] [%l] %v", rank, world_size));
  auto lvl = spdlog::level::from_str(level);
  if (rank != 0) lvl = std::max(lvl, spdlog::level::warn);
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);  // lines reach mpirun's output as they happen
  spdlog::set_default_logger(logger);
}

}  // namespace launcher
