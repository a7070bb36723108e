#include "launcher/signals.h"

#include <csignal>

namespace launcher {
namespace {

volatile std::sig_atomic_t g_terminate = 0;  // SIGINT or SIGTERM, the first one
volatile std::sig_atomic_t g_preempt = 0;    // SIGUSR1 came

void on_terminate(int sig) {
  if (g_terminate != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_terminate = sig;
}

// Repeats are harmless: SLURM may send the warning again, and a warning is no reason to die.
void on_preempt(int) { g_preempt = 1; }

}  // namespace

void install_preemption_handler() { std::signal(SIGUSR1, on_preempt); }

void install_stop_handlers() {
  std::signal(SIGINT, on_terminate);
  std::signal(SIGTERM, on_terminate);
}

bool terminate_requested() { return g_terminate != 0; }
bool preemption_warned() { return g_preempt != 0; }
int stop_signal() { return g_terminate != 0 ? g_terminate : (g_preempt != 0 ? SIGUSR1 : 0); }

}  // namespace launcher
