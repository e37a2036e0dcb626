// test_hooks.cpp — the environment-selected exit, hang or signals of one rank at one step.
#include "src/run/test_hooks.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

bool test_hook_selects(const char* name, int rank, long long step) {
  const char* spec = std::getenv(name);
  int hook_rank = -1;
  long long hook_step = -1;
  return spec != nullptr && std::sscanf(spec, "%d:%lld", &hook_rank, &hook_step) == 2 && hook_rank == rank &&
         hook_step == step;
}

}  // namespace

void maybe_die_for_test(int rank, long long step) {
  if (!test_hook_selects("TRAIN_GPT_TEST_EXIT_AFTER_STEP", rank, step)) return;
  std::fprintf(stderr, "rank %d: exiting after step %lld (TRAIN_GPT_TEST_EXIT_AFTER_STEP)\n", rank, step);
  std::_Exit(3);
}

void maybe_hang_for_test(int rank, long long step) {
  if (!test_hook_selects("TRAIN_GPT_TEST_HANG_AT_STEP", rank, step)) return;
  std::fprintf(stderr, "rank %d: hanging at step %lld (TRAIN_GPT_TEST_HANG_AT_STEP)\n", rank, step);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void maybe_signal_for_test(int rank, long long step) {
  const char* spec = std::getenv("TRAIN_GPT_TEST_SIGNALS_AT_STEP");
  int hook_rank = -1, consumed = 0;
  long long hook_step = -1;
  if (spec == nullptr || std::sscanf(spec, "%d:%lld:%n", &hook_rank, &hook_step, &consumed) != 2 || consumed == 0 ||
      hook_rank != rank || hook_step != step)
    return;
  std::string names = spec + consumed;
  for (size_t at = 0; at <= names.size();) {
    const size_t comma = std::min(names.find(',', at), names.size());
    const std::string name = names.substr(at, comma - at);
    const int signal = name == "TERM" ? SIGTERM : name == "USR1" ? SIGUSR1 : name == "INT" ? SIGINT : 0;
    if (signal == 0) {
      std::fprintf(stderr, "TRAIN_GPT_TEST_SIGNALS_AT_STEP: unknown signal '%s' (TERM, USR1, INT)\n", name.c_str());
      std::_Exit(2);
    }
    std::raise(signal);
    at = comma + 1;
  }
}
