// stop_signals.h — SIGTERM, SIGUSR1 and SIGINT as requests to stop after the current step (with a
// checkpoint) or, during start-up, before anything is written; a second Ctrl-C as "stop now".
// During start-up a signal also interrupts a blocking read (a named pipe, a stalled file system):
// the read fails, and the command ends as the signal asked (main turns that failure into the stop).
#pragma once
#include <exception>

// Installs the handlers (main's first instruction); from then on a stop signal is recorded instead
// of ending the process. Until end_start_up(), a stop signal interrupts the system call in flight.
void install_stop_handlers();

// Training begins: a stop signal now means "after this step" (with a checkpoint where the run
// `saves`: not --save 0), and system calls it interrupts are restarted.
void end_start_up(bool saves);

// Whether end_start_up() has not been called yet.
bool in_start_up();

// Back to the default actions (a signal ends the process), for commands that write nothing and
// have passed their start-up: --eval, --max-steps 0, --generate.
void restore_default_stop_handlers();

// The stop signal received so far (SIGTERM, SIGUSR1 or SIGINT); 0: none.
int pending_stop_signal();

// "SIGTERM", "SIGUSR1" or "SIGINT".
const char* signal_name(int signal);

// A stop signal that arrived during start-up: the command ends with status 0 before it writes
// anything ("received SIGTERM during start-up: stopped before training, nothing written").
class StopDuringStartUp : public std::exception {
 public:
  StopDuringStartUp(int signal, const char* stage);
  const char* what() const noexcept override { return message_; }

 private:
  char message_[128];
};
