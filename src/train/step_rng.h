// Per-step randomness: what dropout (and any other draw from the default generators during a
// step) sees is a pure function of (train.seed, step, rank), so a run resumed from a checkpoint
// draws the same masks as the run that was never interrupted.
//
// Contract: the Trainer calls seed_step_generators at the start of every optimizer step, before
// the first forward. It reseeds the default CPU generator and, when `device` is a CUDA device, that
// device's default generator, with step_seed(seed, step, rank). Nothing else is needed to continue
// exactly: a checkpoint's (seed, step) metadata is the whole random state of the run (the rank
// sampler's order is already a function of (seed, step), ddp/rank_sampler.h). Reseeding is host
// only: it never synchronises with or enqueues work on a device, and it may be called outside a
// CUDA graph capture before a replay (a replay reads the generator's seed and offset when it
// starts). Not thread-safe against other threads drawing from the same default generators
// during the call (the Trainer's loader threads use generators of their own).
//
// Ranks get different streams (their micro-batches are different samples, and equal masks across
// ranks would correlate them); so do steps. The masks therefore depend on the world size and the
// micro-batch, as in any data-parallel trainer: a run resumed on another number of ranks, or after
// an out-of-memory fallback changed the micro-batch, continues correctly but draws other masks.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace train {

// The seed of step `step` (0-based) on `rank`: splitmix64 chained over the three, so that nearby
// (seed, step, rank) triples give unrelated seeds (seed + step would give rank r at step s the
// stream of rank r + 1 at step s - 1). LibTorch's CPU generator (mt19937) keeps only the low 32
// bits, which splitmix64 mixes as well as the high ones.
uint64_t step_seed(uint64_t seed, int64_t step, int rank);

// Reseeds the default CPU generator, and `device`'s default generator when it is a CUDA device,
// with step_seed(seed, step, rank).
void seed_step_generators(uint64_t seed, int64_t step, int rank, c10::Device device);

}  // namespace train
