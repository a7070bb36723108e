// Small control-plane helpers over a Communicator.
#pragma once

#include <string>
#include <vector>

#include "ddp/communicator.h"

namespace ddp {

// Every rank's `text` (truncated to 1 KiB), indexed by rank, on every rank.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text);

}  // namespace ddp
