// stop_signals.cpp — the stop-signal handlers and the flag they set (async-signal-safe only).
#include "src/run/stop_signals.h"

#include <unistd.h>

#include <csignal>

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

// Ctrl-C asks for a stop like SIGTERM; a second one, for a user who will not wait for the step,
// ends the process at once the way Ctrl-C does by default (killed by SIGINT: status 130). Only
// async-signal-safe calls here.
void request_stop(int signal) {
  if (signal == SIGINT && g_stop_signal != 0) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigaction(SIGINT, &default_action, nullptr);
    raise(SIGINT);  // delivered when this handler returns
    return;
  }
  g_stop_signal = signal;
  if (signal == SIGINT) {
    static const char note[] = "\nSIGINT: stopping after this step with a checkpoint (Ctrl-C again: stop at once)\n";
    if (write(STDERR_FILENO, note, sizeof note - 1) < 0) return;
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight continue; the loop checks the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int pending_stop_signal() { return static_cast<int>(g_stop_signal); }

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "SIGINT";
}
