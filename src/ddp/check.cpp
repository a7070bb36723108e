#include "ddp/check.h"

#include <mpi.h>

#include <fmt/format.h>

#include "ddp/errors.h"

namespace ddp::detail {

int world_rank_or_unknown() noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void throw_call_error(const char* api, const char* call, const std::string& reason,
                      const char* file, int line) {
  throw CommError(fmt::format("rank {}: {} call failed: {}: {} ({}:{})", world_rank_or_unknown(),
                              api, call, reason, file, line));
}

}  // namespace ddp::detail
