#include "launcher/exit_status.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdio>
#include <type_traits>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "core/error_text.h"
#include "data/errors.h"
#include "ddp/errors.h"
#include "launcher/device.h"
#include "launcher/exit_codes.h"
#include "launcher/launch.h"
#include "memory/oom.h"
#include "train/trainer.h"

namespace launcher {
namespace {

template <class T>
bool is(const std::exception& e) {
  if constexpr (std::is_same_v<T, std::exception>) {
    return true;
  } else {
    return dynamic_cast<const T*>(&e) != nullptr;
  }
}

constexpr ExitRule kStartup[] = {
    {is<config::ConfigError>, kExitUsage, MessageForm::kWhat},
    {is<LaunchError>, kExitUsage, MessageForm::kWhat},
    {is<DeviceError>, kExitUsage, MessageForm::kWhat},
    {is<checkpoint::CheckpointError>, kExitUsage, MessageForm::kWhat},
    // ddp::PlanError and data::DataError among them.
    {is<std::invalid_argument>, kExitUsage, MessageForm::kWhat},
    {is<memory::OutOfMemoryFatal>, kExitOutOfMemory, MessageForm::kWhat},  // agreed (Trainer)
    {is<c10::OutOfMemoryError>, kExitOutOfMemory, MessageForm::kOutOfMemoryAdvice},
    {is<c10::Error>, kExitFailure, MessageForm::kWithoutBacktrace},
    {is<std::exception>, kExitFailure, MessageForm::kWhat},
};

constexpr ExitRule kAgreedRun[] = {
    // Every rank throws these after the same vote: a clean, agreed exit.
    {is<memory::OutOfMemoryFatal>, kExitOutOfMemory, MessageForm::kWhat, "out-of-memory exit"},
    // Every rank reaches the same verdict from the same reduced gradients.
    {is<train::NonFiniteFatal>, kExitFailure, MessageForm::kWhat, "non-finite exit"},
    // Every rank throws it after the same vote on the checkpoint's files.
    {is<checkpoint::CheckpointNotWritten>, kExitDisk, MessageForm::kWhat, "checkpoint exit"},
};

constexpr ExitRule kAbort[] = {
    {is<ddp::CommTimeout>, kExitTimeout, MessageForm::kWhat},
    // A malformed sample found while training (a loader worker read it): the user's data.
    {is<data::DataError>, kExitUsage, MessageForm::kWhat},
    {is<memory::OutOfMemoryAbort>, kExitOutOfMemory, MessageForm::kWhat},
    {is<c10::Error>, kExitFailure, MessageForm::kWithoutBacktrace},
    {is<std::exception>, kExitFailure, MessageForm::kWhat},
};

std::string message_of(MessageForm form, const std::exception& e, const char* doing) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  switch (form) {
    case MessageForm::kWhat: break;
    case MessageForm::kWithoutBacktrace:
      if (c10_error != nullptr) return c10_error->what_without_backtrace();
      break;
    case MessageForm::kOutOfMemoryAdvice:
      return fmt::format(
          "out of memory {}: {}\nGive each rank more memory (memory.cpu_budget_mb on CPU, "
          "memory.fraction on a GPU) or use a smaller model or data set.",
          doing,
          core::first_line(c10_error != nullptr ? c10_error->what_without_backtrace() : e.what()));
  }
  return e.what();
}

}  // namespace

std::span<const ExitRule> startup_rules() { return kStartup; }
std::span<const ExitRule> agreed_run_rules() { return kAgreedRun; }
std::span<const ExitRule> abort_rules() { return kAbort; }

void print_error(int rank, const std::string& message) {
  if (rank == 0) {
    fmt::print(stderr, "trainer: error: {}\n", message);
  } else {
    fmt::print(stderr, "trainer: error on rank {}: {}\n", rank, message);
  }
  std::fflush(stderr);
}

std::optional<ExitStatus> exit_status(std::span<const ExitRule> rules, const std::exception& e,
                                      const char* doing) {
  for (const ExitRule& rule : rules) {
    if (rule.matches(e))
      return ExitStatus{rule.code, message_of(rule.form, e, doing), rule.barrier};
  }
  return std::nullopt;
}

}  // namespace launcher
