// stop_signals.h — SIGTERM, SIGUSR1 and SIGINT as requests to stop after the current step (with a
// checkpoint), and a second Ctrl-C as "stop now".
#pragma once

// Installs the handlers; from then on a stop signal is recorded instead of ending the process.
void install_stop_handlers();

// The stop signal received so far (SIGTERM, SIGUSR1 or SIGINT); 0: none.
int pending_stop_signal();

// "SIGTERM", "SIGUSR1" or "SIGINT".
const char* signal_name(int signal);
