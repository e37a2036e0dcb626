// test_hooks.h — failures and signals on request, to test how the other ranks end when a peer fails
// (test/checks/distributed_*.sh) and how signals that come together are handled
// (test/checks/stop_signals.sh). NAME=RANK:STEP in the environment selects rank RANK at step STEP.
#pragma once

// TRAIN_GPT_TEST_EXIT_AFTER_STEP=RANK:STEP: rank RANK exits abruptly (no cleanup, status 3) after
// step STEP: a peer that dies.
void maybe_die_for_test(int rank, long long step);

// TRAIN_GPT_TEST_HANG_AT_STEP=RANK:STEP: rank RANK stops taking part at the start of step STEP and
// sleeps until it is killed: a peer that hangs.
void maybe_hang_for_test(int rank, long long step);

// TRAIN_GPT_TEST_SIGNALS_AT_STEP=RANK:STEP:SIG[,SIG...] (SIG: TERM, USR1, INT): rank RANK raises
// these signals at itself, in this order, at the start of step STEP — each is handled before the
// next is raised, which a test sending them from outside cannot promise.
void maybe_signal_for_test(int rank, long long step);
