// staged_output.cpp — a run's output files staged under temporary names and published together
#include "staged_output.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

// The temporary files not yet published, for the signal thread. Never destroyed: that thread may
// run until the process ends.
struct Unpublished {
  std::mutex mutex;  // held while a file is created, renamed or removed, so a signal sees a whole set
  std::vector<std::string> temps;
  bool published = false;
};
Unpublished& unpublished() {
  static Unpublished* state = new Unpublished;
  return *state;
}

void remove_temps_on_signal() {
  const sigset_t set = stop_signals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  Unpublished& state = unpublished();
  state.mutex.lock();  // never given back: the process ends here
  for (const std::string& temp : state.temps) ::unlink(temp.c_str());
  std::fprintf(stderr, "tokenize: %s: stopped%s\n", strsignal(signal),
               state.published ? " after the dataset was complete" : "; no output file was written or replaced");
  std::fflush(stderr);
  ::_exit(128 + signal);
}

}  // namespace

StagedOutput::StagedOutput() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  static std::once_flag started;
  std::call_once(started, [] { std::thread(remove_temps_on_signal).detach(); });
}

StagedOutput::~StagedOutput() {
  Unpublished& state = unpublished();
  std::lock_guard lock(state.mutex);
  files_.clear();  // each removes its temp file unless committed
  state.temps.clear();
}

AtomicFileWriter& StagedOutput::create(const std::string& path) {
  Unpublished& state = unpublished();
  std::lock_guard lock(state.mutex);
  files_.reserve(files_.size() + 1);
  state.temps.reserve(state.temps.size() + 1);  // no allocation fails between the file's creation and its entries
  files_.push_back(std::make_unique<AtomicFileWriter>(path));
  state.temps.push_back(files_.back()->temp_path());
  return *files_.back();
}

void StagedOutput::publish() {
  Unpublished& state = unpublished();
  std::lock_guard lock(state.mutex);
  for (const auto& file : files_) file->close_synced();
  for (const auto& file : files_) file->commit();
  state.temps.clear();
  state.published = true;
}
