#include "launcher/signals.h"

#include <csignal>

namespace launcher {
namespace {

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  if (g_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal = sig;
}

}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

}  // namespace launcher
