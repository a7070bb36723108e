// The banner: what rank 0 logs about a run once start-up has succeeded and before the first
// step (version and launcher, ranks and nodes, gradient buckets, model and data, each rank's
// device and batch, precision, memory plan, the checkpoint resumed from).
#pragma once

#include "launcher/startup.h"

namespace launcher {

// Collective: every rank must call it (it gathers each rank's host and line to rank 0).
void log_banner(const Startup& s);

}  // namespace launcher
