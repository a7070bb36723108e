// The memory plan of one rank: what it will hold during a step, by kind, and the largest
// micro-batch that fits a memory target. Activations come from a probe (the peak of forward +
// backward at two micro-batch sizes, fitted as fixed + slope x batch); everything else is counted.
// A loss that works through its rows in chunks (a language model's output layer over a large
// vocabulary) holds its vocabulary-wide tensors for one chunk at a time: that part grows with the
// micro-batch only until a chunk is full, so it is a term of its own, per row of the chunk in
// force, which a third probe (the first size again with smaller chunks) separates from the slope.
// Pure arithmetic: the Trainer measures, this adds up.
#pragma once

#include <cstdint>
#include <string>

namespace memory {

struct MemoryEstimate {
  int64_t parameters = 0;        // parameters and buffers
  int64_t gradients = 0;         // gradient buckets
  int64_t optimizer_state = 0;   // AdamW: two moments per parameter, in its dtype
  int64_t caches = 0;            // embedding caches (released by uncache_embeddings)
  int64_t other = 0;             // other live tensors on the device (e.g. an in-memory data set)
  int64_t loader = 0;            // the sampler's epoch permutation and this rank's batch as
                                 // loaded (host memory: counted on CPU runs only)
  int64_t checkpoint_copy = 0;   // ddp.shard: parameters with checkpoint.async: the host copy of
                                 // this rank's shard that the background write holds from one
                                 // checkpoint to the next (host memory: CPU runs only)
  int64_t activation_fixed = 0;  // activation peak independent of the micro-batch
  int64_t activation_per_sample = 0;
  // Chunked loss (0 when none): bytes per row of the chunk in force, the loss's rows per sample,
  // and the most rows a chunk takes.
  int64_t activation_per_chunk_row = 0;
  int64_t loss_rows_per_sample = 0;
  int64_t loss_chunk_rows = 0;

  int64_t persistent() const { return parameters + gradients + optimizer_state + caches + other; }
  // Peak tensor memory of a step at micro-batch `micro`.
  int64_t peak(int64_t micro) const;
  // The rows of the loss's chunk at micro-batch `micro`: its rows spread evenly over as few
  // chunks of at most loss_chunk_rows as hold them (0 without a chunked loss).
  int64_t chunk_rows(int64_t micro) const;
  std::string describe(int64_t micro) const;
};

// Fits fixed + slope x batch through two probe peaks (b1 < b2); slope and fixed are clamped at 0.
void fit_activations(int64_t b1, int64_t peak1, int64_t b2, int64_t peak2, MemoryEstimate* e);

// Probe peaks of a model whose loss is chunked: peak1 and peak2 at b1 < b2 samples with the
// model's own chunks of x1 and x2 rows, and peak3 at b1 samples with chunks of x3 < x1 rows. Fits
// fixed + slope x batch + per_row x chunk rows (each clamped at 0); `e`'s loss_rows_per_sample and
// loss_chunk_rows must be set. b1 == b2 (one size only) leaves no slope: all of it per sample.
void fit_activations_chunked(int64_t b1, int64_t peak1, int64_t x1, int64_t b2, int64_t peak2,
                             int64_t x2, int64_t peak3, int64_t x3, MemoryEstimate* e);

// The largest micro-batch in [1, per_rank] whose peak fits `budget_bytes`; 1 when none does
// (the OOM fallback is the safety net), per_rank when nothing grows with the micro-batch.
int64_t largest_micro_batch(const MemoryEstimate& e, int64_t budget_bytes, int64_t per_rank);

}  // namespace memory
