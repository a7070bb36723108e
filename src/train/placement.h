// Placement: where one rank trains: its device and the communicators its step uses. Built by the
// Trainer from what the launcher hands it; everything the step builds borrows it.
#pragma once

#include <c10/core/Device.h>

#include "ddp/communicator.h"

namespace train {

// ddp.shard_group: node (hybrid sharding): the data-plane communicators over this node's ranks
// (the shards span it) and over the ranks of every node with this node rank (the shards are
// replicated over it); from ddp::MpiRuntime::node() / cross_node(). Both or neither.
struct HybridComms {
  ddp::Communicator* node = nullptr;
  ddp::Communicator* cross_node = nullptr;
};

struct Placement {
  ddp::Communicator& control;  // MPI, host tensors: votes and small agreements
  ddp::Communicator& data;     // gradients: NCCL for CUDA, MPI for CPU (may be `control`)
  ddp::Communicator& shard;    // the ranks a shard spans (ddp.shard_group: `data`, or the node's)
  // Hybrid: the ranks this rank's shards are replicated over (the cross-node communicator);
  // nullptr otherwise.
  ddp::Communicator* replicas;
  c10::Device device;

  int rank() const { return control.rank(); }
  int world() const { return control.size(); }
};

}  // namespace train
