// The exception -> exit-code table: which error ends the trainer with which exit code
// (launcher/exit_codes.h) and what it says. main() is the only place that decides to exit, and it
// decides through these tables alone, so a new error type is one row here.
//
// Three moments, one table each (the first row whose type matches wins, so derived types come
// before their bases):
// - startup_rules(): an error in a start-up phase. Every rank votes on it (launcher/startup.h), so
// a
//   user mistake on one rank ends every rank with exit code 2 and one message. The same table
//   ends what runs in one process, with nothing to vote with: the commands beside training
//   (--generate, --export-hf; launcher/generate_command.h) and what fails before MPI starts.
// - agreed_run_rules(): an error every rank throws at the same point of training, after the same
//   vote; the ranks meet at a barrier and exit together. Other errors are not in this table.
// - abort_rules(): any other error after start-up. It cannot be voted on (the other ranks may be
//   inside a collective), so it aborts the whole job.
#pragma once

#include <exception>
#include <optional>
#include <span>
#include <string>

namespace launcher {

// How the message is formed from the exception.
enum class MessageForm {
  kWhat,              // e.what()
  kWithoutBacktrace,  // a c10::Error without LibTorch's backtrace, which helps no user
  kOutOfMemoryAdvice  // "out of memory <doing>: <first line>" and what to do about it
};

struct ExitRule {
  bool (*matches)(const std::exception&);
  int code;
  MessageForm form;
  const char* barrier =
      nullptr;  // agreed_run_rules(): the barrier the ranks meet at before exiting
};

struct ExitStatus {
  int code = 0;
  std::string message;
  const char* barrier = nullptr;  // the rule's
};

std::span<const ExitRule> startup_rules();
std::span<const ExitRule> agreed_run_rules();
std::span<const ExitRule> abort_rules();

// The first rule of `rules` that matches `e`, with its message; nullopt when none does. `doing`
// names what failed, for kOutOfMemoryAdvice ("loading the data set and building the model").
std::optional<ExitStatus> exit_status(std::span<const ExitRule> rules, const std::exception& e,
                                      const char* doing = "");

// An error a rank ends with, on stderr: "trainer: error: MESSAGE" from rank 0, which speaks for
// the job, "trainer: error on rank N: MESSAGE" from another rank.
void print_error(int rank, const std::string& message);

}  // namespace launcher
