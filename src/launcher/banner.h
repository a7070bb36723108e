// The banner: what rank 0 logs about a run once start-up has succeeded and before the first
// step (version and launcher, ranks and nodes, gradient buckets, model and data, each rank's
// device and batch, precision, the loss-spike guard when on, memory plan, the checkpoint resumed
// from). Without a Trainer (--evaluate without data) the lines about batches, buckets and memory
// are left out.
#pragma once

#include <cstdint>
#include <string>

#include "launcher/startup.h"
#include "train/options.h"

namespace launcher {

// The banner's line for an enabled train.skip_spikes: its thresholds, window and
// train.max_skipped_steps (a threshold of 0 is not judged, and not named).
std::string spike_guard_line(const train::SpikeGuardOptions& guard, int64_t max_skipped_steps);

// Collective: every rank must call it (it gathers each rank's host and line to rank 0).
void log_banner(const Startup& s);

}  // namespace launcher
