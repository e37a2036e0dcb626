#!/usr/bin/env bash
# Stop signals from the first instruction of main to the end of a run:
#   - SIGTERM or SIGUSR1 during start-up (here: while the trainer reads the sampler's vocabulary, a
#     FIFO this script opens only once the trainer waits on it, so the signal lands in start-up
#     every time) stops the run cleanly: exit 0, nothing written, an --out-dir being resumed
#     unchanged;
#   - SIGTERM, then one Ctrl-C (SIGINT) during the same step: the Ctrl-C is not "the second
#     Ctrl-C" — the run still stops after the step with a checkpoint and exits 0. Both signals are
#     raised in order inside the trainer by the test hook TRAIN_GPT_TEST_SIGNALS_AT_STEP
#     (RANK:STEP:SIG,SIG), so nothing depends on timing.
# usage: stop_signals.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --batch-size 2
        --seq-len 32 --lr 2e-3 --warmup-steps 2 --val-every 2 --val-steps 1)

# signal_in_start_up NAME SIGNAL FLAGS...: starts the trainer with FLAGS and --sample-every, whose
# vocabulary's encoder.json is a FIFO, sends SIGNAL once the trainer has opened the FIFO (start-up:
# the signal may interrupt the read or come just before it), then closes it; sets status.
signal_in_start_up() {
  local name=$1 signal=$2 pid
  shift 2
  rm -rf "$tmp/vocab"
  mkdir "$tmp/vocab"
  cp data/gpt2_bpe/vocab.bpe "$tmp/vocab/"
  mkfifo "$tmp/vocab/encoder.json"
  "$bin" --sample-every 100 --vocab-dir "$tmp/vocab" "$@" >"$tmp/$name.log" 2>"$tmp/$name.err" &
  pid=$!
  exec 3>"$tmp/vocab/encoder.json"  # returns when the trainer has opened the FIFO: it is in start-up
  kill "-$signal" "$pid"
  (echo '{}' >&3) 2>/dev/null  # a subshell: a reader that died is its SIGPIPE, not ours
  exec 3>&-
  status=0
  wait "$pid" || status=$?
}

# ---- a fresh run
signal_in_start_up fresh TERM "${common[@]}" --out-dir "$tmp/fresh"
[ "$status" -eq 0 ] || fail "SIGTERM during start-up: exit status $status, expected 0"
grep -qx "received SIGTERM during start-up: stopped before training, nothing written" "$tmp/fresh.log" ||
  fail "SIGTERM during start-up: $(tail -n 1 "$tmp/fresh.log")"
[ ! -e "$tmp/fresh" ] || fail "SIGTERM during start-up: --out-dir was created"

# ---- a resume: the --out-dir stays as it was
"$bin" "${common[@]}" --max-steps 2 --out-dir "$tmp/run" >"$tmp/run.log" 2>&1 || { fail "the run to resume failed"; exit 1; }
before=$(tree_digest "$tmp/run")
signal_in_start_up resume USR1 "${common[@]}" --resume auto --out-dir "$tmp/run"
[ "$status" -eq 0 ] || fail "SIGUSR1 during a resume's start-up: exit status $status, expected 0"
grep -qx "received SIGUSR1 during start-up: stopped before training, nothing written" "$tmp/resume.log" ||
  fail "SIGUSR1 during a resume's start-up: $(tail -n 1 "$tmp/resume.log")"
[ "$(tree_digest "$tmp/run")" = "$before" ] || fail "SIGUSR1 during a resume's start-up changed the --out-dir"

# ---- SIGTERM, then one Ctrl-C, at step 2 of 4
status=0
TRAIN_GPT_TEST_SIGNALS_AT_STEP=0:2:TERM,INT "$bin" "${common[@]}" --max-steps 4 --out-dir "$tmp/term_int" \
  >"$tmp/term_int.log" 2>"$tmp/term_int.err" || status=$?
[ "$status" -eq 0 ] || fail "SIGTERM then Ctrl-C: exit status $status, expected 0"
grep -q "^received SIGTERM: stopped after step 2 of 4, checkpoint written" "$tmp/term_int.log" ||
  fail "SIGTERM then Ctrl-C: $(tail -n 1 "$tmp/term_int.log")"
grep -q "^SIGINT: already stopping after this step (SIGTERM); Ctrl-C again: stop at once" "$tmp/term_int.err" ||
  fail "SIGTERM then Ctrl-C: no note for the Ctrl-C: $(cat "$tmp/term_int.err")"
[ -f "$tmp/term_int/checkpoint_00000002/manifest.json" ] || fail "SIGTERM then Ctrl-C: no checkpoint of step 2"
# --save 0: the Ctrl-C's note and the last line say nothing is written, and nothing is.
status=0
TRAIN_GPT_TEST_SIGNALS_AT_STEP=0:2:INT "$bin" "${common[@]}" --max-steps 4 --save 0 --out-dir "$tmp/int_nosave" \
  >"$tmp/int_nosave.log" 2>"$tmp/int_nosave.err" || status=$?
[ "$status" -eq 0 ] || fail "Ctrl-C at --save 0: exit status $status, expected 0"
grep -q "^SIGINT: stopping after this step, nothing written (--save 0; Ctrl-C again: stop at once)" "$tmp/int_nosave.err" ||
  fail "Ctrl-C at --save 0: the note promised otherwise: $(cat "$tmp/int_nosave.err")"
grep -q "^received SIGINT: stopped after step 2 of 4, nothing written (--save 0)" "$tmp/int_nosave.log" ||
  fail "Ctrl-C at --save 0: $(tail -n 1 "$tmp/int_nosave.log")"
[ -z "$(find "$tmp/int_nosave" -name 'checkpoint_*' -o -name model.bin)" ] || fail "Ctrl-C at --save 0 wrote a checkpoint or model.bin"
# Two Ctrl-Cs still end the run at once (killed by SIGINT: status 130).
status=0
TRAIN_GPT_TEST_SIGNALS_AT_STEP=0:2:INT,INT "$bin" "${common[@]}" --max-steps 4 --out-dir "$tmp/int_int" \
  >"$tmp/int_int.log" 2>&1 || status=$?
[ "$status" -eq 130 ] || fail "two Ctrl-Cs: exit status $status, expected 130"

[ "$failures" -eq 0 ] && echo "stop_signals: all checks passed"
[ "$failures" -eq 0 ]
