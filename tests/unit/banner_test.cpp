// The banner's lines that are pure functions of the configuration (launcher/banner.h).

#include <gtest/gtest.h>

#include "launcher/banner.h"

namespace launcher {
namespace TRAINER_UNITY_ID {

TEST(Banner, NamesTheSpikeGuardsThresholdsAndWindow) {
  EXPECT_EQ(spike_guard_line({6.0, 4.5, 100}, 50),
            "loss-spike guard on (train.skip_spikes): a step is skipped when its loss is more than "
            "6 or its gradient norm is more than 4.5 standard deviations above the mean of the "
            "last 100 applied steps (judged once 100 steps are applied), or when its loss is not "
            "finite; 50 skipped in a row end the run (train.max_skipped_steps)");
  // A threshold of 0 judges nothing and is not named.
  EXPECT_EQ(spike_guard_line({0.0, 3.0, 20}, 5),
            "loss-spike guard on (train.skip_spikes): a step is skipped when its gradient norm is "
            "more than 3 standard deviations above the mean of the last 20 applied steps (judged "
            "once 20 steps are applied), or when its loss is not finite; 5 skipped in a row end "
            "the run (train.max_skipped_steps)");
}

}  // namespace TRAINER_UNITY_ID
}  // namespace launcher
