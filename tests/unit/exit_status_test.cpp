// The exception -> exit-code table (launcher/exit_status.h): the codes and messages the e2e tests
// and job scripts rely on.

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <functional>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/errors.h"
#include "ddp/errors.h"
#include "launcher/device.h"
#include "launcher/exit_codes.h"
#include "launcher/exit_status.h"
#include "launcher/launch.h"
#include "memory/oom.h"
#include "train/trainer.h"

namespace TRAINER_UNITY_ID {

using launcher::ExitStatus;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// What `rules` make of the exception `thrower` throws.
std::optional<ExitStatus> status_of(std::span<const launcher::ExitRule> rules,
                                    const std::function<void()>& thrower,
                                    const char* doing = "doing it") {
  try {
    thrower();
  } catch (const std::exception& e) {
    return launcher::exit_status(rules, e, doing);
  }
  ADD_FAILURE() << "nothing thrown";
  return std::nullopt;
}

template <class E>
std::function<void()> raise(const char* what = "the message") {
  return [what] { throw E(what); };
}

std::function<void()> raise_c10_oom() {
  return [] {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2 GiB");
  };
}

std::function<void()> raise_c10_error() {
  return [] { TORCH_CHECK(false, "shape mismatch"); };
}

TEST(ExitStatus, StartupUserMistakesExit2WithTheirMessage) {
  const auto rules = launcher::startup_rules();
  for (const auto& thrower :
       {raise<config::ConfigError>(), raise<launcher::LaunchError>(),
        raise<launcher::DeviceError>(), raise<ddp::PlanError>(),
        raise<checkpoint::CheckpointError>(), raise<checkpoint::CheckpointDamaged>(),
        raise<std::invalid_argument>(), raise<data::DataError>()}) {
    const auto s = status_of(rules, thrower);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->code, launcher::kExitUsage);
    EXPECT_EQ(s->message, "the message");
  }
}

TEST(ExitStatus, StartupOutOfMemoryExits4) {
  const auto rules = launcher::startup_rules();
  const auto agreed = status_of(rules, raise<memory::OutOfMemoryFatal>());
  EXPECT_EQ(agreed->code, launcher::kExitOutOfMemory);
  EXPECT_EQ(agreed->message, "the message");
  // LibTorch's: what was being done, the first line of its message (no backtrace), what to do.
  const auto torch =
      status_of(rules, raise_c10_oom(), "loading the data set and building the model");
  EXPECT_EQ(torch->code, launcher::kExitOutOfMemory);
  EXPECT_THAT(torch->message,
              StartsWith("out of memory loading the data set and building the model: CUDA out of "
                         "memory. Tried to allocate 2 GiB\nGive each rank more memory"));
  EXPECT_THAT(torch->message, Not(HasSubstr("Exception raised from")));
}

TEST(ExitStatus, StartupFailuresExit1WithoutLibTorchsBacktrace) {
  const auto rules = launcher::startup_rules();
  const auto torch = status_of(rules, raise_c10_error());
  EXPECT_EQ(torch->code, launcher::kExitFailure);
  EXPECT_THAT(torch->message, HasSubstr("shape mismatch"));
  EXPECT_THAT(torch->message, Not(HasSubstr("Exception raised from")));
  const auto other = status_of(rules, raise<std::runtime_error>());
  EXPECT_EQ(other->code, launcher::kExitFailure);
  EXPECT_EQ(other->message, "the message");
}

TEST(ExitStatus, OnlyAgreedFailuresEndARunTogether) {
  const auto rules = launcher::agreed_run_rules();
  const auto oom = status_of(rules, raise<memory::OutOfMemoryFatal>());
  EXPECT_EQ(oom->code, launcher::kExitOutOfMemory);
  EXPECT_STREQ(oom->barrier, "out-of-memory exit");
  const auto nonfinite = status_of(rules, raise<train::NonFiniteFatal>());
  EXPECT_EQ(nonfinite->code, launcher::kExitFailure);
  EXPECT_STREQ(nonfinite->barrier, "non-finite exit");
  // One rank's failure is not agreed: it aborts the job.
  EXPECT_FALSE(status_of(rules, raise<memory::OutOfMemoryAbort>()));
  EXPECT_FALSE(status_of(rules, raise<ddp::CommTimeout>()));
  EXPECT_FALSE(status_of(rules, raise_c10_oom()));
}

TEST(ExitStatus, AbortsCarryTheirOwnCodes) {
  const auto rules = launcher::abort_rules();
  EXPECT_EQ(status_of(rules, raise<ddp::CommTimeout>())->code, launcher::kExitTimeout);
  EXPECT_EQ(status_of(rules, raise<data::DataError>())->code, launcher::kExitUsage);
  EXPECT_EQ(status_of(rules, raise<memory::OutOfMemoryAbort>())->code, launcher::kExitOutOfMemory);
  // Not a user mistake once training runs: only data::DataError is.
  EXPECT_EQ(status_of(rules, raise<std::invalid_argument>())->code, launcher::kExitFailure);
  EXPECT_EQ(status_of(rules, raise<ddp::CommError>())->code, launcher::kExitFailure);
  const auto torch = status_of(rules, raise_c10_error());
  EXPECT_EQ(torch->code, launcher::kExitFailure);
  EXPECT_THAT(torch->message, Not(HasSubstr("Exception raised from")));
}

}  // namespace TRAINER_UNITY_ID
