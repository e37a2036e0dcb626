// test_hooks.cpp — the environment-selected exit and hang of one rank at one step.
#include "src/run/test_hooks.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
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
