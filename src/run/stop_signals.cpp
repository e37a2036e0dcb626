// stop_signals.cpp — the stop-signal handlers and the flags they set (async-signal-safe only).
#include "src/run/stop_signals.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;  // the signal that asked for the stop
volatile std::sig_atomic_t g_interrupted = 0;  // a Ctrl-C came
volatile std::sig_atomic_t g_start_up = 1;    // training has not begun
volatile std::sig_atomic_t g_saves = 1;       // the stop writes a checkpoint (not --save 0)

void write_note(const char* note, size_t bytes) {
  if (write(STDERR_FILENO, note, bytes) < 0) return;
}

// Ctrl-C asks for a stop like SIGTERM; a second Ctrl-C, for a user who will not wait for the step,
// ends the process at once the way Ctrl-C does by default (killed by SIGINT: status 130). A Ctrl-C
// after SIGTERM or SIGUSR1 is the first Ctrl-C, not the second. Only async-signal-safe calls here.
void request_stop(int signal) {
  if (signal != SIGINT) {
    g_stop_signal = signal;
    return;
  }
  if (g_interrupted != 0) {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigaction(SIGINT, &default_action, nullptr);
    raise(SIGINT);  // delivered when this handler returns
    return;
  }
  g_interrupted = 1;
  static const char ending[] = "\nSIGINT: ending the command during its start-up, nothing written (Ctrl-C again: at once)\n";
  static const char stopping[] = "\nSIGINT: stopping after this step with a checkpoint (Ctrl-C again: stop at once)\n";
  static const char stopping_unsaved[] =
      "\nSIGINT: stopping after this step, nothing written (--save 0; Ctrl-C again: stop at once)\n";
  static const char after_term[] = "\nSIGINT: already stopping after this step (SIGTERM); Ctrl-C again: stop at once\n";
  static const char after_usr1[] = "\nSIGINT: already stopping after this step (SIGUSR1); Ctrl-C again: stop at once\n";
  if (g_start_up != 0) write_note(ending, sizeof ending - 1);
  else if (g_stop_signal == SIGTERM) write_note(after_term, sizeof after_term - 1);
  else if (g_stop_signal == SIGUSR1) write_note(after_usr1, sizeof after_usr1 - 1);
  else if (g_saves != 0) write_note(stopping, sizeof stopping - 1);
  else write_note(stopping_unsaved, sizeof stopping_unsaved - 1);
  if (g_stop_signal == 0) g_stop_signal = SIGINT;
}

// restart: whether an interrupted system call is restarted (training: reads and writes in flight
// continue; the loop checks the flag) or fails with EINTR (start-up: a read that blocks, from a
// named pipe, say, ends).
void set_stop_handlers(void (*handler)(int), bool restart) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = restart ? SA_RESTART : 0;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

}  // namespace

void install_stop_handlers() { set_stop_handlers(request_stop, false); }

void end_start_up(bool saves) {
  g_saves = saves ? 1 : 0;
  g_start_up = 0;
  set_stop_handlers(request_stop, true);
}

bool in_start_up() { return g_start_up != 0; }

void restore_default_stop_handlers() { set_stop_handlers(SIG_DFL, true); }

int pending_stop_signal() { return static_cast<int>(g_stop_signal); }

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "SIGINT";
}

StopDuringStartUp::StopDuringStartUp(int signal, const char* stage) {
  std::snprintf(message_, sizeof message_, "received %s during start-up: stopped before %s, nothing written",
                signal_name(signal), stage);
}
