// The memory section's keys (memory::MemoryOptions), each declared once with its default.

#include "config/key_builders.h"
#include "memory/allocator_guard.h"
#include "memory/options.h"

namespace config::schema {

std::vector<KeyDef> memory_keys() {
  return {
      enum_list("memory.fallback", FIELD(memory.fallback),
                "[checkpoint_activations, halve_micro_batch, uncache_embeddings]",
                memory::kRungNames,
                "what to do, in order, when a rank runs out of memory in a step "
                "(shard_optimizer: become ddp.shard: optimizer in place; shard_parameters: "
                "become ddp.shard: parameters in place; rungs a model or run cannot take are "
                "passed over)"),
      integer("memory.min_micro_batch", FIELD(memory.min_micro_batch), "1", 1, kMax,
              "halve_micro_batch stops at this micro-batch"),
      real("memory.fraction", FIELD(memory.fraction), "0", 0.0, 1.0, false, false,
           "CUDA: cap of each process's share of its device memory (0: no cap)"),
      real_or_auto("memory.cpu_budget_mb", FIELD(memory.cpu_budget_mb), "auto", 0.0, kInf,
                   "CPU: tensor memory budget per rank in MiB; beyond it allocations fail as out "
                   "of memory and take memory.fallback's rungs (auto: 90% of the memory available "
                   "at start, divided among the node's ranks, less 256 MiB each; 0: none)"),
      checked_text("memory.inject_oom", FIELD(memory.inject_oom),
                   "test hook: fail allocations at 'rank:step:phase[:times]; ...' (phase "
                   "forward|backward|optimizer, times N|always)",
                   [](const std::string& v) { memory::parse_injections(v); }),
      integer("memory.check_every", FIELD(memory.check_every), "100", 0, kMax,
              "log every rank's memory every N steps (0: at start and end only)"),
      real("memory.target_fraction", FIELD(memory.target_fraction), "0.85", 0.0, 1.0, true, false,
           "train.micro_batch_size auto: the largest micro-batch whose estimated peak fits this "
           "share of the device (or CPU budget)"),
      real("memory.high_watermark", FIELD(memory.high_watermark), "0.92", 0.0, 1.0, true, false,
           "warn when a rank uses more than this share of its device (or CPU budget)")};
}

}  // namespace config::schema
