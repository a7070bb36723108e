// What the tests read of a train::Trainer that the trainer itself has no use for: a friend of
// Trainer (src/train/trainer.h), so that no public method exists for tests only.
#pragma once

#include <cstdint>
#include <memory>

#include "train/muon.h"
#include "train/trainer.h"

namespace train {

struct TrainerTestSeam {
  static std::unique_ptr<PinnedUnits> pin_parameters(Trainer& trainer) {
    return trainer.state_.pin();
  }
  static const GraphStep& graphs(const Trainer& trainer) { return *trainer.graphs_; }
  static int64_t muon_newton_schulz_calls(const Trainer& trainer) {
    const auto* muon = trainer.state_.muon();
    return muon != nullptr ? muon->newton_schulz_calls() : 0;
  }
};

}  // namespace train

namespace trainer_test {

// ddp.shard: parameters: every unit gathered (the frozen base too) while the result lives, so a
// test reads the whole model; null under the other modes. Collective: every rank, at one point.
inline std::unique_ptr<train::PinnedUnits> pin_parameters(train::Trainer& trainer) {
  return train::TrainerTestSeam::pin_parameters(trainer);
}

// train.cuda_graphs: the step's captures and replays so far.
inline const train::GraphStep& graphs(const train::Trainer& trainer) {
  return train::TrainerTestSeam::graphs(trainer);
}

// train.optimizer: muon: the Newton-Schulz runs on this rank so far (0 otherwise).
inline int64_t muon_newton_schulz_calls(const train::Trainer& trainer) {
  return train::TrainerTestSeam::muon_newton_schulz_calls(trainer);
}

}  // namespace trainer_test
